#pragma once
// The Hugging Face tensors of a mixture-of-experts layer (qwen2_moe, qwen3_moe, mixtral) in the
// two layouts folders have: one module per expert, as transformers 4 and transformers 5's
// save_pretrained write them, or transformers 5's fused 3-D experts. Both hold expert e's
// [gate; up] rows and its down matrix at the same places of one (E, 2I, C) and one (E, C, I)
// block, so the model registers either set of names packed and runs the same math on them.
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "io/hf_checkpoint.h"
#include "models/model_config.h"

namespace fab {

struct NamedShape {
  std::string name;
  Shape shape;
};

struct MoeLayerNames {
  NamedShape router;                           // (E, C), no bias
  std::vector<NamedShape> gate_up;             // fused: gate_up_proj (E, 2I, C); else gate_e, up_e, ... (I, C)
  std::vector<NamedShape> down;                // fused: down_proj (E, C, I); else down_e (C, I)
  std::vector<NamedShape> shared_gate_up;      // qwen2_moe's shared expert: gate_proj, up_proj (Is, C)
  NamedShape shared_down;                      // (C, Is)
  NamedShape shared_expert_gate;               // (1, C)
  bool has_shared_expert() const { return !shared_gate_up.empty(); }
};

// Layer `layer`'s tensors in the layout config.moe.fused_experts names.
MoeLayerNames moe_layer_names(const ModelConfig& config, int64_t layer);

// Which layout `weights` hold: true for the fused one. A folder with tensors of both layouts is a
// UserError naming one of each; one with neither keeps the per-expert default (load_weights then
// names the first missing tensor).
bool detect_fused_experts(const ModelConfig& config, const HfWeights& weights);

}  // namespace fab
