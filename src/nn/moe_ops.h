#pragma once
// The differentiable ops of a mixture-of-experts layer (models/decoder_layer.h's MoeMlp), as
// transformers computes qwen2_moe / qwen3_moe / mixtral: a softmax router over all experts in
// fp32, top-k, optional renormalisation, each expert a SwiGLU MLP run as one GEMM over the rows
// routed to it, and Switch Transformer's load-balancing loss over every MoE layer of a pass.
// Host (CPU) tensors; the experts' GEMMs in fp32, or bf16 inputs with fp32 accumulation.
#include <cstdint>
#include <memory>
#include <vector>

#include "autograd/tape.h"
#include "nn/expert_exchange.h"

namespace fab {

struct MoeShape {
  int64_t experts = 0, top_k = 0, intermediate = 0;
  bool norm_topk_prob = false;
};

// transformers' load_balancing_loss_func over one forward pass: the router logits of every MoE
// layer joined, padding rows masked out,
//   aux = E * sum_e F_e * P_e,   F_e = (top-k picks of e) / R,   P_e = (sum of p_e) / R,
// R the unmasked rows of all layers together (perfect balance: aux = top_k). Each MoE layer adds
// its rows in forward; finish() closes the sums once the last layer ran (a recomputed forward
// during backward adds nothing). With `weight` > 0 each layer's backward adds the gradient of
// weight * aux to its router logits.
struct RouterLoss {
  RouterLoss(int64_t experts, int64_t top_k, std::vector<float> row_mask, double weight);
  int64_t experts, top_k;
  std::vector<float> row_mask;  // 1 real token, 0 padding, per row of a layer; empty: every row counts
  double weight;                // d(objective)/d(aux)
  std::vector<double> picks, prob_sum;  // (E) over every layer
  double rows = 0;
  std::vector<double> layer_load_max_over_mean;  // per MoE layer: max_e picks_e / mean_e picks_e
  bool finished = false;

  void finish() { finished = true; }
  double aux() const;          // E * sum_e F_e P_e (0 without rows)
  double mask(int64_t row) const { return row_mask.empty() ? 1.0 : row_mask[size_t(row)]; }
  // d aux / d p_e of an unmasked row: E F_e / R (F_e is constant: top-k is not differentiable).
  double aux_grad(int64_t e) const { return rows > 0 ? double(experts) * picks[size_t(e)] / (rows * rows) : 0.0; }
};

// Every expert's weights, packed: gate_up (E * 2I, C) holds expert e's [gate; up] at rows
// [2Ie, 2I(e+1)), down (E * C, I) its down matrix at rows [Ce, C(e+1)). In bf16 mode also their
// bf16 copies: the experts' GEMMs then take bf16 inputs (the rows, the SwiGLU activations and the
// gradients rounded to bf16) with fp32 accumulation and output, as a dense layer's linears do.
struct ExpertWeights {
  Var gate_up, down;
  Tensor gate_up_bf16, down_bf16;  // undefined in fp32
  bool bf16() const { return gate_up_bf16.defined(); }
};

// The routed experts of h (N, C) given the router's logits (N, E): each row goes to its top-k
// experts, expert e computes down_e(silu(gate_e x) * up_e x) over all its rows in two GEMMs, and
// the row's output is the sum over its experts of weight * output.
// `aux` (may be null) collects the pass's router statistics. Under expert parallel, `exchange`
// (nn/expert_exchange.h) sends the rows to the ranks computing their experts and brings the
// outputs back, forward and backward; this rank computes (and writes the gradients of) only
// experts [first_expert, first_expert + local_experts) of gate_up and down. Null: every expert here.
Var moe_experts(Tape& tape, const Var& h, const Var& logits, const ExpertWeights& weights, const MoeShape& shape,
                const std::shared_ptr<RouterLoss>& aux, std::shared_ptr<ExpertExchange> exchange = nullptr);

// sigmoid(g) * y, g (N, 1), y (N, C): qwen2_moe's gated shared expert.
Var sigmoid_gate(Tape& tape, const Var& g, const Var& y);

}  // namespace fab
