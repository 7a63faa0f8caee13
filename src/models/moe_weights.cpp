#include "models/moe_weights.h"

#include "core/error.h"

namespace fab {
namespace {

// Mixtral's per-expert checkpoints keep the MoE block as block_sparse_moe with w1 (gate), w3 (up)
// and w2 (down); transformers 5 renames it mlp when it fuses the experts.
std::string block_prefix(const ModelConfig& c, int64_t layer) {
  const bool legacy_mixtral = c.model_type == "mixtral" && !c.moe.fused_experts;
  return "model.layers." + std::to_string(layer) + (legacy_mixtral ? ".block_sparse_moe." : ".mlp.");
}

bool is_fused_name(const std::string& name) {
  for (const char* suffix : {".experts.gate_up_proj", ".experts.down_proj"})
    if (name.size() > std::string(suffix).size() && name.compare(name.size() - std::string(suffix).size(),
                                                                  std::string(suffix).size(), suffix) == 0)
      return true;
  return false;
}

bool is_per_expert_name(const std::string& name) {
  const size_t at = name.find(".experts.");
  return at != std::string::npos && at + 9 < name.size() && std::isdigit(static_cast<unsigned char>(name[at + 9]));
}

}  // namespace

MoeLayerNames moe_layer_names(const ModelConfig& c, int64_t layer) {
  const MoeConfig& m = c.moe;
  const int64_t E = m.num_experts, I = m.moe_intermediate_size, C = c.hidden_size;
  const std::string p = block_prefix(c, layer);
  MoeLayerNames n;
  n.router = {p + "gate.weight", {E, C}};
  if (m.fused_experts) {
    n.gate_up = {{p + "experts.gate_up_proj", {E, 2 * I, C}}};
    n.down = {{p + "experts.down_proj", {E, C, I}}};
  } else {
    const bool mixtral = c.model_type == "mixtral";
    for (int64_t e = 0; e < E; ++e) {
      const std::string x = p + "experts." + std::to_string(e) + ".";
      n.gate_up.push_back({x + (mixtral ? "w1.weight" : "gate_proj.weight"), {I, C}});
      n.gate_up.push_back({x + (mixtral ? "w3.weight" : "up_proj.weight"), {I, C}});
      n.down.push_back({x + (mixtral ? "w2.weight" : "down_proj.weight"), {C, I}});
    }
  }
  if (m.shared_expert_intermediate_size > 0) {
    const int64_t S = m.shared_expert_intermediate_size;
    n.shared_gate_up = {{p + "shared_expert.gate_proj.weight", {S, C}}, {p + "shared_expert.up_proj.weight", {S, C}}};
    n.shared_down = {p + "shared_expert.down_proj.weight", {C, S}};
    n.shared_expert_gate = {p + "shared_expert_gate.weight", {1, C}};
  }
  return n;
}

bool detect_fused_experts(const ModelConfig& config, const HfWeights& weights) {
  std::string fused, per_expert;
  for (const std::string& name : weights.names()) {
    if (fused.empty() && is_fused_name(name)) fused = name;
    if (per_expert.empty() && is_per_expert_name(name)) per_expert = name;
  }
  FAB_USER_CHECK(fused.empty() || per_expert.empty(),
                 "{}: the weights mix transformers 5's fused experts (\"{}\" in {}) with per-expert tensors (\"{}\" "
                 "in {}); a folder holds one layout",
                 config.model_type, fused, weights.file_of(fused).path(), per_expert,
                 weights.file_of(per_expert).path());
  return !fused.empty();
}

}  // namespace fab
