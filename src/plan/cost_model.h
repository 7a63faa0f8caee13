#pragma once
// The planner's cost model (docs/PLANNER.md): for one parallel layout of one training problem on
// one cluster, the peak memory of the busiest device and the time of one optimizer step.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "models/model_config.h"
#include "plan/cluster_spec.h"

namespace fab {

// What is trained: the model, tokens per sequence, sequences per optimizer step, precision.
struct PlanProblem {
  ModelConfig model;
  int64_t sequence_length = 0;
  int64_t global_batch = 0;
  bool bf16 = true;
  // What a worker holds in host memory beyond the runtime (the tokenizer it loads); counted only
  // when the device is the host (this machine).
  double host_bytes = 0;
};

struct PlanLayout {
  int tp = 1, pp = 1, vpp = 1, dp = 1;
  int zero_stage = 0;
  bool recompute = false;
  bool sequence_parallel = false;  // on whenever tp > 1 (Megatron's advice; it only saves)
  int64_t micro_batch_size = 1, gradient_accumulation_steps = 1;
  std::vector<int64_t> chunk_layers;  // pp x vpp model chunks, as parallel_layout splits them
  // Context parallel: each row's tokens split over cp ranks (ring attention); world = tp x cp x pp
  // x dp, and gradients are reduced, and ZeRO shards, over dp x cp.
  int cp = 1;
  // Expert parallel, folded into dp x cp: each rank holds E/ep of a mixture-of-experts model's
  // experts (their gradients reduced, and ZeRO-sharded, over dp x cp / ep) and exchanges its
  // routed rows by all-to-all.
  int ep = 1;
};

struct MemoryBreakdown {
  double parameters = 0, gradients = 0, optimizer_state = 0;
  double activations = 0, logits = 0, buffers = 0, reserved = 0;  // reserved: runtime + host_bytes
  // What the final save gathers in host memory once a step's activations and logits are gone:
  // under tp every rank's whole-model copy, under pp the other stages' weights on stage 0.
  double save_gathered = 0;
  // The peak: the model states, buffers and reserve, plus the larger of a step's activations and
  // logits chunk and the save's gathered weights.
  double total() const {
    return parameters + gradients + optimizer_state + buffers + reserved + std::max(activations + logits, save_gathered);
  }
};

struct TimeBreakdown {
  double compute = 0;         // the busiest stage's GEMMs and attention over all micro-batches
  double tensor_comm = 0;     // tp/sp collectives (on the critical path)
  double context_comm = 0;    // cp's ring sends of keys and values, the part attention does not hide
  double pipeline_comm = 0;   // stage-to-stage sends
  double bubble = 0;          // pipeline fill and drain
  double expert_comm = 0;     // ep's all-to-all of routed rows (on the critical path)
  double data_comm = 0;       // dp/ZeRO collectives, all of them
  double data_comm_exposed = 0;  // the part not hidden behind backward
  double optimizer = 0;
  double step = 0;
  double bubble_fraction = 0;
  double tokens_per_s = 0, mfu = 0;
};

// Parameters of decoder layer / embedding / LM head + final norm (tied: the head has none of its own).
// A mixture-of-experts model's layers differ (dense ones, mlp_only_layers): the mean layer.
double layer_parameters(const ModelConfig& m);
// Of those, the routed experts' (the mean layer's; 0 without experts): what expert parallel splits.
double expert_parameters(const ModelConfig& m);
double embedding_parameters(const ModelConfig& m);
double head_parameters(const ModelConfig& m);
// Forward FLOPs per token: a decoder layer at this sequence length (causal; a mixture of experts'
// mean layer: the router, top-k experts and a shared expert), the LM head.
double layer_forward_flops(const ModelConfig& m, int64_t sequence_length);
double head_forward_flops(const ModelConfig& m);
// Activation bytes one decoder layer keeps for backward, per token, before tp/sp division:
// `replicated` (norm inputs and outputs, split only by sp) and `split` (split by tp).
struct LayerActivationBytes {
  double replicated = 0, split = 0;
};
LayerActivationBytes layer_activation_bytes(const ModelConfig& m, double element_bytes);

// Weights, gradients and optimizer state of `parameters` on one of `dp` ranks at a ZeRO stage
// (Rajbhandari et al. 2020: stage 1 divides the optimizer state by dp, 2 also the gradients, 3
// also the weights).
MemoryBreakdown model_state_memory(double parameters, int dp, int zero_stage, const DeviceSpec& device, bool bf16);

MemoryBreakdown predict_memory(const PlanProblem& problem, const ClusterSpec& cluster, const PlanLayout& layout);
TimeBreakdown predict_time(const PlanProblem& problem, const ClusterSpec& cluster, const PlanLayout& layout);

// Alpha-beta time of a ring collective over `ranks` ranks moving `bytes` (the full buffer): an
// all-reduce sends 2 (n-1)/n of it in 2 (n-1) messages, an all-gather or reduce-scatter (n-1)/n
// in n-1 (what MpiCommunicator's rings send, bench/RESULTS.md).
double ring_all_reduce_seconds(double bytes, int ranks, const LinkSpec& link);
double ring_gather_seconds(double bytes, int ranks, const LinkSpec& link);

}  // namespace fab
