#pragma once
// LoRA (Hu et al. 2021) as PEFT computes it: a frozen linear y = x W^T gains, per adapted
// projection, y += scaling * dropout(x) A^T B^T with A (r, in) kaiming-uniform (a = sqrt(5)),
// B (out, r) zero, scaling = alpha / r (alpha / sqrt(r) with rsLoRA). Dropout acts on the
// adapter's input only. q/k/v and gate/up stay one fused GEMM; each projection's adapter adds
// into its column block of the fused output.
#include <cstdint>
#include <string>
#include <vector>

#include "autograd/tape.h"
#include "nn/ops.h"

namespace fab {

struct LoraOptions {
  int64_t rank = 0;  // 0: no adapters
  double alpha = 0;  // 0: 2 * rank (LLaMA-Factory's default)
  double dropout = 0;
  bool rslora = false;
  std::vector<std::string> targets;          // q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj
  // A vision-language model's tower blocks (vision_lora_names(); a name the model's blocks lack
  // adapts nothing); empty: none, as LLaMA-Factory with freeze_vision_tower (the merger and the
  // patch embedding never have adapters). A model without a tower ignores them.
  std::vector<std::string> vision_targets;
  std::vector<std::string> modules_to_save;  // PEFT modules_to_save: embed_tokens, lm_head, norm, ...
  uint64_t seed = 0;                         // A's initialisation and the dropout masks

  bool enabled() const { return rank > 0; }
  double effective_alpha() const { return alpha > 0 ? alpha : 2.0 * double(rank); }
  float scaling() const;
};

// The projection names LoRA may adapt in a decoder layer, in layer order (shared_expert_gate:
// qwen2_moe's; a mixture-of-experts layer's gate/up/down are its shared expert's).
const std::vector<std::string>& lora_projection_names();

// The linears of a vision tower block LoRA may adapt: qkv and proj, then qwen2_vl's fc1 / fc2 or
// qwen2_5_vl's gate_proj / up_proj / down_proj.
std::vector<std::string> vision_lora_names(bool qwen2_5);

// One adapter of a projection whose outputs are columns [column, column + B.rows) of a possibly
// fused linear's output. `stream` tells its dropout masks apart from the other adapters'.
struct LoraBranch {
  Var a, b;  // (r, in), (out, r)
  int64_t column = 0;
  uint64_t stream = 0;
};

// What one forward pass of the adapters uses: scaling, dropout p and the seed of this
// micro-batch's masks.
struct LoraPass {
  float scaling = 1;
  float dropout = 0;
  uint64_t seed = 0;
  GemmKind gemm = GemmKind::standard;  // the base projection's
};

// y (rows, out) += scaling * dropout(x) A^T B^T for every branch, in place; x (rows, in).
// Backward (through y's gradient dy, restricted to the branch's columns):
//   u = xd A^T, us = scaling u, y += us B^T
//   dB += dy^T us;  dus = dy B;  du = scaling dus;  dA += du^T xd;  dxd = du A;  dx += dxd * mask
// with xd = x * mask, mask = keep / (1 - p) (ones without dropout).
void add_lora(Tape& tape, const Var& x, const Var& y, const std::vector<LoraBranch>& branches, const LoraPass& pass);

// A (r, in) as PEFT initialises it: kaiming_uniform_(a = sqrt(5)), i.e. U(-1/sqrt(in), 1/sqrt(in)).
void init_lora_a(float* a, int64_t rank, int64_t in, uint64_t seed);

// W (out, in) += scaling * B A: the adapter merged into the weight it adapts.
void merge_lora(float* w, const float* a, const float* b, int64_t out, int64_t in, int64_t rank, float scaling);

}  // namespace fab
