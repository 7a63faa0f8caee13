#include "models/peft_adapter.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
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

nlohmann::json adapter_config_json(const LoraOptions& lora, const std::string& base_model) {
  std::vector<std::string> targets = lora.targets, modules = lora.modules_to_save;
  std::sort(targets.begin(), targets.end());
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
    o.targets = string_list(j, file, "target_modules");
  }
  for (const std::string& t : o.targets) {
    const auto& known = lora_projection_names();
    FAB_USER_CHECK(std::find(known.begin(), known.end(), t) != known.end(),
                   "{}: target module \"{}\" is not a projection of this decoder (q_proj, k_proj, v_proj, o_proj, "
                   "gate_proj, up_proj, down_proj)", file, t);
  }
  o.modules_to_save = string_list(j, file, "modules_to_save");
  require_plain(j, file, "use_dora", false);
  require_plain(j, file, "bias", "none");
  require_plain(j, file, "fan_in_fan_out", false);
  require_plain(j, file, "lora_bias", false);
  require_plain(j, file, "rank_pattern", nlohmann::json::object());
  require_plain(j, file, "alpha_pattern", nlohmann::json::object());
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
    tensors.push_back({kPrefix + p->name, params.values_f32(*p)});  // a view on the host, else a copy
  save_safetensors(weights_path(dir).string(), tensors, {{"format", "pt"}});
  write_file_atomically(config_path(dir).string(),
                        adapter_config_json(model.lora(), base_model_name_or_path).dump(2) + "\n");
}

void load_adapter(DecoderModel& model, const std::string& dir) {
  const std::string path = weights_path(dir).string();
  FAB_USER_CHECK(fs::exists(path), "{}: no adapter_model.safetensors (PEFT adapters in pickles, adapter_model.bin, "
                 "are not read)", dir);
  const SafetensorsFile file = SafetensorsFile::open(path);
  std::set<std::string> expected;
  ParamBuffer& params = model.params();
  for (const ParamInfo* p : saved_parameters(model)) {
    const std::string key = kPrefix + p->name;
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
