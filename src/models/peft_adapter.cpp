#include "models/peft_adapter.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/file_write.h"
#include "io/safetensors.h"
#include "models/hf_model.h"

namespace fab {
namespace fs = std::filesystem;

namespace {

constexpr const char* kPrefix = "base_model.model.";

fs::path config_path(const std::string& dir) { return fs::path(dir) / "adapter_config.json"; }
fs::path weights_path(const std::string& dir) { return fs::path(dir) / "adapter_model.safetensors"; }

bool is_value_head(const std::string& name) { return name.rfind("v_head.", 0) == 0; }

// The tensors an adapter folder holds for this model: every adapter and every modules_to_save
// parameter, by their names inside the model. A reward model's value head is not among them: it
// goes beside, into value_head.safetensors, as LLaMA-Factory saves it.
std::vector<const ParamInfo*> saved_parameters(const DecoderModel& model) {
  std::vector<const ParamInfo*> out;
  for (const ParamInfo& p : model.params().params())
    if (!is_value_head(p.name)) out.push_back(&p);
  return out;
}

// The module a vision-language model's adapter sits on, by transformers 5's name.
std::string vlm_module(const std::string& part, int64_t index, const std::string& name) {
  const bool attention = name == "q_proj" || name == "k_proj" || name == "v_proj" || name == "o_proj" ||
                         name == "qkv" || name == "proj";
  const bool tower = part == "model.visual.blocks.";
  return part + std::to_string(index) + "." + (attention ? (tower ? "attn." : "self_attn.") : "mlp.") + name;
}

// target_modules: the projection names the model has adapters on (lora_target all names
// shared_expert_gate, which only qwen2_moe has); for a vision-language model every adapted
// module's full name, as LLaMA-Factory hands PEFT its patch_target_modules list.
std::vector<std::string> target_modules(const DecoderModel& model) {
  const LoraOptions& lora = model.lora();
  const ModelConfig& c = model.config();
  std::vector<std::string> out;
  for (const std::string& t : lora.targets)
    for (const ParamInfo& p : model.params().params())
      if (p.name.ends_with("." + t + ".lora_A.weight")) {
        out.push_back(t);
        break;
      }
  if (c.vision) {
    out.clear();
    for (int64_t i = 0; i < c.num_hidden_layers; ++i)
      for (const std::string& t : lora.targets) out.push_back(vlm_module("model.language_model.layers.", i, t));
    const std::vector<std::string> linears = vision_lora_names(c.vision->qwen2_5);  // what the blocks have
    for (int64_t b = 0; b < c.vision->depth; ++b)
      for (const std::string& t : lora.vision_targets)
        if (std::find(linears.begin(), linears.end(), t) != linears.end())
          out.push_back(vlm_module("model.visual.blocks.", b, t));
  }
  std::sort(out.begin(), out.end());
  return out;
}

nlohmann::json adapter_config_json(const DecoderModel& model, const std::string& base_model) {
  const LoraOptions& lora = model.lora();
  std::vector<std::string> targets = target_modules(model), modules = lora.modules_to_save;
  nlohmann::json j = {
      {"alora_invocation_tokens", nullptr}, {"alpha_pattern", nlohmann::json::object()},
      {"arrow_config", nullptr},           {"auto_mapping", nullptr},
      {"base_model_name_or_path", base_model}, {"bias", "none"},
      {"corda_config", nullptr},           {"ensure_weight_tying", false},
      {"eva_config", nullptr},             {"exclude_modules", nullptr},
      {"fan_in_fan_out", false},           {"inference_mode", true},
      {"init_lora_weights", true},         {"layer_replication", nullptr},
      {"layers_pattern", nullptr},         {"layers_to_transform", nullptr},
      {"loftq_config", nlohmann::json::object()}, {"lora_alpha", lora.effective_alpha()},
      {"lora_bias", false},                {"lora_dropout", lora.dropout},
      {"megatron_config", nullptr},        {"megatron_core", "megatron.core"},
      {"modules_to_save", modules.empty() ? nlohmann::json(nullptr) : nlohmann::json(modules)},
      {"peft_type", "LORA"},               {"peft_version", "0.18.1"},
      {"qalora_group_size", 16},           {"r", lora.rank},
      {"rank_pattern", nlohmann::json::object()}, {"revision", nullptr},
      {"target_modules", targets},         {"target_parameters", nullptr},
      {"task_type", "CAUSAL_LM"},          {"trainable_token_indices", nullptr},
      {"use_dora", false},                 {"use_qalora", false},
      {"use_rslora", lora.rslora}};
  // An integral alpha is written as an integer, as PEFT does.
  if (lora.effective_alpha() == double(int64_t(lora.effective_alpha()))) j["lora_alpha"] = int64_t(lora.effective_alpha());
  return j;
}

// A field PEFT sets to something Fabrica's LoRA does not compute must be at its plain value.
void require_plain(const nlohmann::json& j, const std::string& file, const char* field, const nlohmann::json& plain) {
  if (!j.contains(field) || j[field].is_null()) return;
  const nlohmann::json& v = j[field];
  const bool empty = (v.is_object() || v.is_array()) && v.empty();
  FAB_USER_CHECK(v == plain || empty, "{}: {} {} is not supported (expected {})", file, field, v.dump(), plain.dump());
}

// The modules LoRA may adapt in layers (blocks) [0, 128), by transformers 5's names: what a
// rank_pattern key may not name. A mixture-of-experts layer's gate/up/down are its shared expert's.
const std::vector<std::string>& adaptable_modules() {
  static const std::vector<std::string> modules = [] {
    std::vector<std::string> out;
    for (int64_t i = 0; i < 128; ++i) {
      for (const char* part : {"model.layers.", "model.language_model.layers."})
        for (const std::string& n : lora_projection_names()) {
          out.push_back(vlm_module(part, i, n));
          if (n == "gate_proj" || n == "up_proj" || n == "down_proj")
            out.push_back(part + std::to_string(i) + ".mlp.shared_expert." + n);
        }
      for (const bool qwen2_5 : {false, true})
        for (const std::string& n : vision_lora_names(qwen2_5)) out.push_back(vlm_module("model.visual.blocks.", i, n));
    }
    return out;
  }();
  return modules;
}

// rank_pattern / alpha_pattern (a per-module rank or alpha) is refused where a key matches a
// module Fabrica adapts, as PEFT matches it (the key after a dot, or the whole name, to the end);
// keys for other modules are ignored: peft 0.21 writes {".*\\.gate_up_proj": 2r} for the fused
// experts of qwen3_moe, which Fabrica does not adapt (target_parameters is refused).
void require_no_pattern_on_adapted_modules(const nlohmann::json& j, const std::string& file, const char* field) {
  if (!j.contains(field) || j[field].is_null()) return;
  FAB_USER_CHECK(j[field].is_object(), "{}: {} must be an object, got {}", file, field, j[field].dump());
  for (const auto& [key, value] : j[field].items()) {
    bool used = true;
    try {
      const std::regex pattern("(.*\\.)?(" + key + ")");
      used = std::any_of(adaptable_modules().begin(), adaptable_modules().end(),
                         [&](const std::string& m) { return std::regex_match(m, pattern); });
    } catch (const std::regex_error&) {
    }
    FAB_USER_CHECK(!used, "{}: {} {} is not supported (a per-module {} on {}: expected none)", file, field,
                   j[field].dump(), field, key);
  }
}

std::vector<std::string> string_list(const nlohmann::json& j, const std::string& file, const char* field) {
  std::vector<std::string> out;
  if (!j.contains(field) || j[field].is_null()) return out;
  FAB_USER_CHECK(j[field].is_array(), "{}: {} must be a list of module names, got {}", file, field, j[field].dump());
  for (const auto& v : j[field]) {
    FAB_USER_CHECK(v.is_string(), "{}: {} must be a list of module names, got {}", file, field, j[field].dump());
    out.push_back(v.get<std::string>());
  }
  return out;
}

void add_once(std::vector<std::string>& names, const std::string& name) {
  if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
}

// A module name with its layer or block index made 0: every layer has the same modules.
std::string first_layer(const std::string& module) {
  static const std::regex index(R"((^|\.)(layers|blocks)\.[0-9]+\.)");
  return std::regex_replace(module, index, "$1$2.0.");
}

// target_modules as PEFT matches them: a module is adapted when its name is a target or ends with
// "." + target. Targets are projection names, suffixes (peft shrinks a long list to the shortest
// suffixes that match the same modules: attn.proj, qkv, ...) or full names (LLaMA-Factory's list
// for a vision-language model), matched here against layer 0's modules of either part: the
// language model's projections (targets) and the tower blocks' linears (vision_targets, used by a
// model with a tower). Which layers hold adapters follows from adapter_model.safetensors, whose
// tensors load_adapter checks against these.
void read_target_modules(const std::vector<std::string>& modules, const std::string& file, LoraOptions& o) {
  auto matches = [](const std::string& module, const std::string& target) {
    return module == target ||
           (module.size() > target.size() && module.compare(module.size() - target.size(), target.size(), target) == 0 &&
            module[module.size() - target.size() - 1] == '.');
  };
  for (const std::string& m : modules) {
    const std::string target = first_layer(m);
    bool found = false;
    for (const std::string& n : lora_projection_names()) {
      const bool attention = n == "q_proj" || n == "k_proj" || n == "v_proj" || n == "o_proj";
      const std::string inner = std::string(attention ? "self_attn." : "mlp.") + n;
      if (matches("model.language_model.layers.0." + inner, target) || matches("model.layers.0." + inner, target)) {
        add_once(o.targets, n);
        found = true;
      }
    }
    for (const std::string& n : {"qkv", "proj", "fc1", "fc2", "gate_proj", "up_proj", "down_proj"}) {
      const std::string inner = std::string(n == std::string("qkv") || n == std::string("proj") ? "attn." : "mlp.") + n;
      if (matches("model.visual.blocks.0." + inner, target) || matches("visual.blocks.0." + inner, target)) {
        add_once(o.vision_targets, n);
        found = true;
      }
    }
    FAB_USER_CHECK(found, "{}: target module \"{}\" is not a projection of this decoder (q_proj, k_proj, v_proj, "
                   "o_proj, gate_proj, up_proj, down_proj, shared_expert_gate) or a vision tower block's linear (qkv, "
                   "proj, fc1, fc2, "
                   "gate_proj, up_proj, down_proj)", file, m);
  }
}

}  // namespace

bool is_adapter_folder(const std::string& dir) { return fs::exists(config_path(dir)); }

bool adapter_holds_value_head(const std::string& dir) {
  const fs::path weights = weights_path(dir);
  return fs::exists(weights) &&
         SafetensorsFile::open(weights.string()).contains(std::string(kPrefix) + "v_head.summary.weight");
}

LoraOptions read_adapter_config(const std::string& dir, std::string* base_model) {
  const std::string file = config_path(dir).string();
  std::ifstream in(file);
  FAB_USER_CHECK(in, "{}: cannot open (adapter_name_or_path must be a PEFT adapter folder)", file);
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  FAB_USER_CHECK(j.is_object(), "{}: not a JSON object", file);
  FAB_USER_CHECK(j.value("peft_type", "") == "LORA", "{}: peft_type must be \"LORA\", got {}", file,
                 j.contains("peft_type") ? j["peft_type"].dump() : "nothing");
  LoraOptions o;
  FAB_USER_CHECK(j.contains("r") && j["r"].is_number_integer() && j["r"].get<int64_t>() > 0,
                 "{}: r must be a positive integer", file);
  o.rank = j["r"].get<int64_t>();
  FAB_USER_CHECK(j.contains("lora_alpha") && j["lora_alpha"].is_number() && j["lora_alpha"].get<double>() > 0,
                 "{}: lora_alpha must be a positive number", file);
  o.alpha = j["lora_alpha"].get<double>();
  o.dropout = j.contains("lora_dropout") && j["lora_dropout"].is_number() ? j["lora_dropout"].get<double>() : 0.0;
  FAB_USER_CHECK(o.dropout >= 0 && o.dropout < 1, "{}: lora_dropout must be in [0, 1), got {}", file, o.dropout);
  o.rslora = j.value("use_rslora", false);
  FAB_USER_CHECK(j.contains("target_modules"), "{}: no target_modules", file);
  if (j["target_modules"].is_string()) {
    FAB_USER_CHECK(j["target_modules"] == "all-linear", "{}: target_modules \"{}\" is a regular expression, which is "
                   "not supported (give a list of module names)", file, j["target_modules"].get<std::string>());
    o.targets = lora_projection_names();
  } else {
    read_target_modules(string_list(j, file, "target_modules"), file, o);
  }
  o.modules_to_save = string_list(j, file, "modules_to_save");
  require_plain(j, file, "use_dora", false);
  require_plain(j, file, "bias", "none");
  require_plain(j, file, "fan_in_fan_out", false);
  require_plain(j, file, "lora_bias", false);
  require_plain(j, file, "target_parameters", nlohmann::json::array());  // LoRA inside the experts' 3-D weights
  require_no_pattern_on_adapted_modules(j, file, "rank_pattern");
  require_no_pattern_on_adapted_modules(j, file, "alpha_pattern");
  require_plain(j, file, "layers_to_transform", nullptr);
  if (base_model) *base_model = j.value("base_model_name_or_path", "");
  return o;
}

void save_adapter(const DecoderModel& model, const std::string& dir, const std::string& base_model_name_or_path) {
  FAB_CHECK(model.lora().enabled(), "save_adapter on a model without LoRA adapters");
  fs::create_directories(dir);
  std::vector<NamedTensor> tensors;
  const ParamBuffer& params = model.params();
  for (const ParamInfo* p : saved_parameters(model))
    tensors.push_back({kPrefix + saved_name(model.config(), p->name), params.values_f32(*p)});  // a view on the host, else a copy
  save_safetensors(weights_path(dir).string(), tensors, {{"format", "pt"}});
  write_file_atomically(config_path(dir).string(),
                        adapter_config_json(model, base_model_name_or_path).dump(2) + "\n");
}

void load_adapter(DecoderModel& model, const std::string& dir) {
  const std::string path = weights_path(dir).string();
  FAB_USER_CHECK(fs::exists(path), "{}: no adapter_model.safetensors (PEFT adapters in pickles, adapter_model.bin, "
                 "are not read)", dir);
  const SafetensorsFile file = SafetensorsFile::open(path);
  std::set<std::string> expected;
  ParamBuffer& params = model.params();
  for (const ParamInfo* p : saved_parameters(model)) {
    const std::string key = kPrefix + saved_name(model.config(), p->name);
    expected.insert(key);
    FAB_USER_CHECK(file.contains(key), "{}: missing tensor \"{}\" {}", path, key, shape_str(p->shape));
    FAB_USER_CHECK(file.entries().at(key).shape == p->shape, "{}: tensor \"{}\" has shape {}, the model needs {}", path,
                   key, shape_str(file.entries().at(key).shape), shape_str(p->shape));
    params.set_values(*p, file.as_f32(key).data<float>());
  }
  for (const std::string& name : file.names()) {
    // Earlier Fabrica builds also wrote a reward model's value head here: read into a model that
    // has one (value_head.safetensors, read after, holds the same), passed over by one that has not.
    if (name.rfind(std::string(kPrefix) + "v_head.", 0) == 0) {
      const std::string inner = name.substr(std::string(kPrefix).size());
      if (model.options().value_head && params.contains(inner)) {
        const ParamInfo& p = params.info(inner);
        FAB_USER_CHECK(file.entries().at(name).shape == p.shape, "{}: tensor \"{}\" has shape {}, the model needs {}",
                       path, name, shape_str(file.entries().at(name).shape), shape_str(p.shape));
        params.set_values(p, file.as_f32(name).data<float>());
      }
      continue;
    }
    FAB_USER_CHECK(expected.count(name), "{}: unexpected tensor \"{}\" for these LoRA targets and modules_to_save",
                   path, name);
  }
  model.weights_changed();
}

void merge_adapters(DecoderModel& model) {
  const LoraOptions& lora = model.lora();
  const ParamBuffer& params = model.params();
  for (const auto& [p, buffer] : model.base_parameters()) {
    const std::string suffix = ".weight";
    const std::string module = p->name.substr(0, p->name.size() - suffix.size());
    const std::string a = module + ".lora_A.weight", b = module + ".lora_B.weight";
    if (!params.contains(a)) continue;
    FAB_CHECK(buffer->has_fp32(), "merging into {} needs fp32 weights", p->name);
    const ParamInfo& ia = params.info(a);
    merge_lora(buffer->values().data<float>() + p->offset, params.values().data<float>() + ia.offset,
               params.values().data<float>() + params.info(b).offset, p->shape[0], p->shape[1], lora.rank,
               lora.scaling());
  }
  model.weights_changed();
  model.set_adapters_enabled(false);
}

void save_trained_weights(const DecoderModel& model, const std::string& dir, const std::string& base_model) {
  if (!model.lora().enabled()) return save_model_folder(model, dir);
  save_adapter(model, dir, base_model);
  if (model.options().value_head) save_value_head(model, dir);  // LLaMA-Factory's LoRA reward model
}

void load_trained_weights(DecoderModel& model, const std::string& dir) {
  if (model.lora().enabled())
    load_adapter(model, dir);
  else
    load_weights(model, HfWeights::open(dir));
}

}  // namespace fab
