#pragma once
// The differentiable ops of a mixture-of-experts layer (models/decoder_layer.h's MoeMlp), as
// transformers computes qwen2_moe / qwen3_moe / mixtral: a softmax router over all experts in
// fp32, top-k, optional renormalisation, each expert a SwiGLU MLP run as one GEMM over the rows
// routed to it, and Switch Transformer's load-balancing loss over every MoE layer of a pass.
// Host (CPU) tensors; the experts' GEMMs in fp32, or bf16 inputs with fp32 accumulation.
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "autograd/tape.h"
#include "comm/communicator.h"
#include "nn/expert_exchange.h"

namespace fab {

struct MoeShape {
  int64_t experts = 0, top_k = 0, intermediate = 0;
  bool norm_topk_prob = false;
  int64_t layer = 0;  // which decoder layer: its slot in the pass's RouterLoss
};

// How the load-balancing loss is formed (RouterOptions::balancing):
//  * transformers: its load_balancing_loss_func over one forward pass, the router logits of every
//    MoE layer joined, padding rows masked out:
//      aux = E * sum_e F_e * P_e,   F_e = (top-k picks of e) / R,   P_e = (sum of p_e) / R,
//    R the unmasked rows of all layers together (perfect balance: aux = top_k);
//  * per_layer (Megatron's aux_loss): each MoE layer's own E / (k R^2) * sum_e picks_e * sum(p_e)
//    over its unmasked rows (balance: 1), the objective taking their sum over the layers;
//  * per_sequence (Megatron's seq_aux_loss): the same within each sequence (row of the batch),
//    averaged over the batch's sequences, summed over the layers;
//  * none: no load-balancing term (aux() still reports per_layer's value).
enum class LoadBalancing { transformers, per_layer, per_sequence, none };

// The router's training options (Megatron's; train/stages set them from the config).
struct RouterOptions {
  LoadBalancing balancing = LoadBalancing::transformers;
  double z_weight = 0;  // d(objective)/d(z_l) of each MoE layer's z-loss mean_t logsumexp(z_t)^2 (ST-MoE)
  // > 0: each expert takes at most ceil(k R / E * factor) of a pass's picks (R the real rows this
  // rank routes; Megatron counts padding rows too, here padding takes no capacity); the rest are
  // dropped: they add nothing to the token's output (its other experts' weights unchanged).
  // 0: dropless.
  double capacity_factor = 0;
  bool drop_by_position = false;  // drop the latest rows (Megatron's "position"), else the least probable ("probs")
};

// The router statistics of one forward pass, and its load-balancing and z-loss terms. Each MoE
// layer adds its rows in forward; finish() closes the sums once the last layer ran (a recomputed
// forward during backward adds nothing). With `weight` > 0 each layer's backward adds the gradient
// of weight * (the balancing term) to its router logits, and with options.z_weight > 0 that of
// the z-loss.
struct RouterLoss {
  RouterLoss(int64_t experts, int64_t top_k, std::vector<float> row_mask, double weight, RouterOptions options = {},
             int64_t sequence_length = 0);
  struct Layer {
    std::vector<double> picks, prob_sum;          // (E) over the layer's unmasked rows
    std::vector<double> seq_picks, seq_prob_sum;  // (B, E) per sequence (per_sequence only)
    std::vector<double> seq_rows;                 // (B)
    double rows = 0, z_sum = 0;                   // z_sum: sum of logsumexp^2 over unmasked rows
  };
  int64_t experts, top_k;
  std::vector<float> row_mask;  // 1 real token, 0 padding, per row of a layer; empty: every row counts
  double weight;                // d(objective)/d(balancing term)
  RouterOptions options;
  int64_t sequence_length;      // rows per sequence (per_sequence)
  // Context parallel: the ranks sharing each sequence; every layer's sums are added over them in
  // forward (one all-reduce), so the terms are those of the whole sequences. Null: this rank's rows.
  Communicator* group = nullptr;
  std::map<int64_t, Layer> layers;               // by decoder layer
  std::vector<double> layer_load_max_over_mean;  // per MoE layer: max_e picks_e / mean_e picks_e
  bool finished = false;

  std::vector<double> joined_picks, joined_prob_sum;  // over every layer, set by finish() (transformers)
  double joined_rows = 0;

  void finish();                                  // the last layer ran
  Layer& add_layer(int64_t layer, int64_t rows);  // a fresh layer's sums over its `rows` rows
  void sum_layer_over_group(Layer& l) const;      // l's sums added over `group` (collective)
  double aux() const;     // after finish(): transformers' joined aux, else the mean over layers of each layer's
  double z_loss() const;  // mean over layers of mean_t logsumexp(z_t)^2
  double mask(int64_t row) const { return row_mask.empty() ? 1.0 : row_mask[size_t(row)]; }
  // dp[e] += scale * d(balancing term)/d p_e of row `row` of `layer`, every e (nothing for a
  // masked row; the picks are constants: top-k is not differentiable).
  void add_aux_grad(int64_t layer, int64_t row, double scale, double* dp) const;
  // d(sum_l z_l)/d logsumexp_t of row `row` of `layer`: 2 lse_t / R_l (0 for a masked row).
  double z_grad(int64_t layer, int64_t row, double lse) const;

 private:
  double layer_aux(const Layer& l) const;  // per_layer / per_sequence: one layer's term
};

// The experts' weights a rank holds (all E, or its E / ep under expert parallel), packed: gate_up
// (E * 2I, C) holds expert e's [gate; up] at rows [2Ie, 2I(e+1)), down (E * C, I) its down matrix
// at rows [Ce, C(e+1)). In bf16 mode also their
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
// outputs back, forward and backward; `weights` then hold only this rank's experts
// [first_expert, first_expert + local_experts), local expert l at block l. Null: every expert here.
Var moe_experts(Tape& tape, const Var& h, const Var& logits, const ExpertWeights& weights, const MoeShape& shape,
                const std::shared_ptr<RouterLoss>& aux, std::shared_ptr<ExpertExchange> exchange = nullptr);

// sigmoid(g) * y, g (N, 1), y (N, C): qwen2_moe's gated shared expert.
Var sigmoid_gate(Tape& tape, const Var& g, const Var& y);

}  // namespace fab
