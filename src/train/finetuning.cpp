#include "train/finetuning.h"

#include <algorithm>
#include <cctype>
#include <set>

#include "core/error.h"
#include "models/hf_model.h"
#include "models/peft_adapter.h"

namespace fab {
namespace {

std::vector<std::string> comma_list(const std::string& text) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    const size_t first = text.find_first_not_of(" \t", start);
    if (first < end) out.push_back(text.substr(first, text.find_last_not_of(" \t", end - 1) + 1 - first));
    start = end + 1;
  }
  return out;
}

void require_known(const std::vector<std::string>& names, const std::vector<std::string>& known, const char* key) {
  for (const std::string& n : names) {
    std::string list;
    for (const std::string& k : known) list += (list.empty() ? "" : ", ") + k;
    FAB_USER_CHECK(std::find(known.begin(), known.end(), n) != known.end(), "{}: \"{}\" is not one of {}", key, n,
                   list);
  }
}

// PEFT matches modules_to_save by module name: a module whose name ends with the target (no dot
// needed, so "norm" also takes input_layernorm, q_norm, ...: peft's `key.endswith(target)`).
bool in_modules(const std::string& param, const std::vector<std::string>& modules) {
  const std::string module = param.substr(0, param.rfind('.'));
  for (const std::string& m : modules)
    if (module.size() >= m.size() && module.compare(module.size() - m.size(), m.size(), m) == 0) return true;
  return false;
}

// What lora_target may name: the decoder's projections and a vision tower block's linears (a
// name the model does not have is refused when it is built).
std::vector<std::string> lora_target_names() {
  std::vector<std::string> names = lora_projection_names();
  for (const std::string& n : vision_lora_names(false)) names.push_back(n);
  return names;
}

// LLaMA-Factory 0.9's LoRA targets on qwen2_vl / qwen2_5_vl: find_all_linear_modules for
// lora_target all (every linear's own name but lm_head's and the merger's; the tower's only
// without freeze_vision_tower), then patch_target_modules: a module is adapted when a target is a
// substring of its name and no forbidden key is (visual.patch_embed and visual.blocks under
// freeze_vision_tower, language_model under freeze_language_model, patch_embed always). Every
// layer (block) has the same module names, so layer 0's decide.
void resolve_multimodal_lora(const TrainConfig& c, const ModelConfig& model, LoraOptions& lora) {
  const std::vector<std::string> vision = vision_lora_names(model.vision->qwen2_5);
  std::vector<std::string> targets = comma_list(c.lora_target);
  if (c.lora_target == "all") {
    targets = lora_projection_names();
    if (!c.freeze_vision_tower) targets.insert(targets.end(), vision.begin(), vision.end());
  }
  auto adapted = [&targets](const std::string& module) {
    return std::any_of(targets.begin(), targets.end(),
                       [&](const std::string& t) { return module.find(t) != std::string::npos; });
  };
  lora.targets.clear();
  lora.vision_targets.clear();
  for (const std::string& n : lora_projection_names()) {
    const bool attention = n == "q_proj" || n == "k_proj" || n == "v_proj" || n == "o_proj";
    const std::string module = "model.language_model.layers.0." + std::string(attention ? "self_attn." : "mlp.") + n;
    if (!c.freeze_language_model && adapted(module)) lora.targets.push_back(n);
  }
  for (const std::string& n : vision) {
    const std::string module = "model.visual.blocks.0." + std::string(n == "qkv" || n == "proj" ? "attn." : "mlp.") + n;
    if (!c.freeze_vision_tower && adapted(module)) lora.vision_targets.push_back(n);
  }
  FAB_USER_CHECK(!lora.targets.empty() || !lora.vision_targets.empty(),
                 "lora_target {} adapts no linear of {} with freeze_vision_tower {} and freeze_language_model {} "
                 "(LLaMA-Factory never adapts the merger or the patch embedding)",
                 c.lora_target, model.model_type, c.freeze_vision_tower ? "true" : "false",
                 c.freeze_language_model ? "true" : "false");
}

const std::vector<std::string> kOuterModules = {"embed_tokens", "lm_head", "norm"};
const std::vector<std::string> kSavableModules = {"embed_tokens", "lm_head", "norm", "input_layernorm",
                                                  "post_attention_layernorm", "q_norm", "k_norm"};

LoraOptions lora_from_config(const TrainConfig& c) {
  LoraOptions o;
  o.rank = c.lora_rank;
  o.alpha = double(c.lora_alpha);
  o.dropout = c.lora_dropout;
  o.rslora = c.use_rslora;
  o.targets = c.lora_target == "all" ? lora_projection_names() : comma_list(c.lora_target);
  require_known(o.targets, lora_target_names(), "lora_target");
  FAB_USER_CHECK(!o.targets.empty(), "lora_target is empty: expected all or a comma list of projections");
  o.modules_to_save = comma_list(c.additional_target);
  require_known(o.modules_to_save, kSavableModules, "additional_target");
  return o;
}

// LLaMA-Factory's freeze tuning: the last N layers (N > 0) or the first |N| (N < 0); of those the
// modules named (all: every one); plus freeze_extra_modules. A parameter trains when one of these
// patterns is a substring of its name (".3." or ".3.mlp" for layer 3, or the extra module's name).
std::vector<std::string> freeze_patterns(const TrainConfig& c, int64_t num_layers) {
  const int64_t n = c.freeze_trainable_layers;
  FAB_USER_CHECK(n != 0, "freeze_trainable_layers must not be 0 (N > 0: the last N layers, N < 0: the first |N|)");
  std::vector<int64_t> layers;
  if (n > 0)
    for (int64_t i = std::max<int64_t>(0, num_layers - n); i < num_layers; ++i) layers.push_back(i);
  else
    for (int64_t i = 0; i < std::min(-n, num_layers); ++i) layers.push_back(i);
  const std::vector<std::string> modules = comma_list(c.freeze_trainable_modules);
  require_known(modules, {"all", "self_attn", "mlp", "input_layernorm", "post_attention_layernorm"},
                "freeze_trainable_modules");
  std::vector<std::string> patterns;
  for (const std::string& m : modules)
    for (int64_t i : layers) patterns.push_back(format(".{}.{}", i, m == "all" ? std::string() : m));
  const std::vector<std::string> extra = comma_list(c.freeze_extra_modules);
  require_known(extra, kOuterModules, "freeze_extra_modules");
  patterns.insert(patterns.end(), extra.begin(), extra.end());
  return patterns;
}

// LLaMA-Factory matches transformers' parameter names, and transformers 5 names a MoE layer's
// experts without an index: Mixtral's block_sparse_moe (the name in its checkpoints, and
// Fabrica's) is the module `mlp`, and every expert's tensors are the fused mlp.experts.* (so
// ".2." picks layer 2, never expert 2 of every layer, and all of a layer's experts train or none).
std::string transformers5_name(const std::string& name) {
  static const std::string checkpoint_name = ".block_sparse_moe.", experts = ".experts.";
  std::string module = name;
  if (const size_t at = module.find(checkpoint_name); at != std::string::npos)
    module.replace(at, checkpoint_name.size(), ".mlp.");
  if (const size_t at = module.find(experts); at != std::string::npos) {
    size_t digits = at + experts.size();
    while (digits < module.size() && std::isdigit(static_cast<unsigned char>(module[digits]))) ++digits;
    if (digits > at + experts.size() && digits < module.size() && module[digits] == '.')
      module.erase(at + experts.size(), digits + 1 - (at + experts.size()));
  }
  return module;
}

}  // namespace

void apply_finetuning(const TrainConfig& c, int64_t num_layers, DecoderOptions& options) {
  if (c.finetuning_type == "lora") {
    LoraOptions lora = c.adapter_name_or_path.empty() ? lora_from_config(c) : read_adapter_config(c.adapter_name_or_path);
    lora.seed = uint64_t(c.seed);
    use_lora(lora, options);
  } else if (c.finetuning_type == "freeze") {
    const std::vector<std::string> patterns = freeze_patterns(c, num_layers);
    options.trainable = [patterns](const std::string& name) {
      const std::string module = transformers5_name(name);
      return std::any_of(patterns.begin(), patterns.end(),
                         [&](const std::string& p) { return module.find(p) != std::string::npos; });
    };
  }
}

void apply_multimodal_freezing(const TrainConfig& c, const ModelConfig& model, DecoderOptions& options) {
  if (!model.vision) return;
  if (options.lora.enabled() && c.adapter_name_or_path.empty()) resolve_multimodal_lora(c, model, options.lora);
  std::vector<std::string> forbidden;
  if (c.freeze_vision_tower) forbidden = {"model.visual.patch_embed.", "model.visual.blocks."};
  if (c.freeze_multi_modal_projector) forbidden.push_back(kMergerPrefix);
  const bool language_model_frozen = c.freeze_language_model;
  auto chosen = options.trainable;
  options.trainable = [forbidden, language_model_frozen, chosen](const std::string& name) {
    if (chosen && !chosen(name)) return false;
    if (language_model_frozen && !is_vision_parameter(name)) return false;
    return std::none_of(forbidden.begin(), forbidden.end(),
                        [&](const std::string& f) { return name.rfind(f, 0) == 0; });
  };
}

void use_lora(const LoraOptions& lora, DecoderOptions& options) {
  options.lora = lora;
  const std::vector<std::string> modules = lora.modules_to_save;
  options.trainable = [modules](const std::string& name) { return in_modules(name, modules); };
}

void load_initial_adapter(const TrainConfig& c, DecoderModel& model) {
  if (c.finetuning_type == "lora" && !c.adapter_name_or_path.empty()) load_adapter(model, c.adapter_name_or_path);
}

}  // namespace fab
