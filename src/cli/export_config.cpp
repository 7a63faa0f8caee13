#include "cli/export_config.h"

#include <algorithm>
#include <filesystem>
#include <map>

#include <yaml-cpp/yaml.h>

#include "config/train_config.h"
#include "config/yaml_file.h"
#include "core/error.h"

namespace fab {
namespace {

// The keys an export YAML may hold: read, or harmless here (noted), or refused with the reason.
const std::vector<std::string>& export_keys() {
  static const std::vector<std::string> keys = {
      "model_name_or_path", "adapter_name_or_path", "export_dir", "export_size", "export_device",
      "export_legacy_format", "export_quantization_bit", "export_quantization_dataset",
      "export_quantization_nsamples", "export_quantization_maxlen", "export_hub_model_id", "template",
      "trust_remote_code", "finetuning_type"};
  return keys;
}

std::string keys_text() {
  std::string text;
  for (const std::string& k : export_keys()) text += (text.empty() ? "" : ", ") + k;
  return text;
}

}  // namespace

ExportYaml load_export_yaml(const std::string& path) {
  const YAML::Node root =
      load_yaml_file(path, "an export YAML (model_name_or_path, adapter_name_or_path, export_dir)");
  FAB_USER_CHECK(!root.IsNull(), "{}: no settings (the file is empty or only comments); export needs "
                 "model_name_or_path and export_dir (and adapter_name_or_path to merge a LoRA adapter)", path);
  FAB_USER_CHECK(root.IsMap(), "{}: expected a mapping of keys to values", path);
  ExportYaml y;
  std::map<std::string, int> first_line;
  std::string finetuning_type;
  for (const auto& item : root) {
    const int line = item.first.Mark().line + 1;
    const std::string key = item.first.IsScalar() ? item.first.Scalar() : YAML::Dump(item.first);
    const std::string where = format("{}:{}: key \"{}\"", path, line, key);
    const auto [seen, is_new] = first_line.emplace(key, line);
    FAB_USER_CHECK(is_new, "{} is set twice (first on line {})", where, seen->second);
    if (std::find(export_keys().begin(), export_keys().end(), key) == export_keys().end()) {
      const std::string guess = nearest_name(key, export_keys());
      throw UserError(format("{}:{}: unknown key \"{}\" for export{}; an export YAML reads {}", path, line, key,
                             guess.empty() ? "" : " (did you mean \"" + guess + "\"?)", keys_text()));
    }
    const YAML::Node& value = item.second;
    if (value.IsNull()) continue;  // `key: null` (or empty) is LLaMA-Factory's "not set"
    FAB_USER_CHECK(value.IsScalar(), "{}: expected a single value, got \"{}\"", where, YAML::Dump(value));
    const std::string text = value.Scalar();
    if (key == "model_name_or_path") y.model_name_or_path = text;
    else if (key == "adapter_name_or_path") y.adapter_name_or_path = text;
    else if (key == "export_dir") y.export_dir = text;
    else if (key == "export_size") {
      try {
        y.export_size = value.as<int64_t>();
      } catch (const YAML::Exception&) {
        y.export_size = 0;
      }
      FAB_USER_CHECK(y.export_size >= 1 && y.export_size <= (int64_t(1) << 20),
                     "{}: expected a whole number of GB per weight file (at least 1), got \"{}\"", where, text);
    } else if (key == "export_legacy_format") {
      const std::optional<bool> legacy = parse_bool(text);
      FAB_USER_CHECK(legacy.has_value(), "{}: expected true or false, got \"{}\"", where, text);
      FAB_USER_CHECK(!*legacy, "{}: true asks for pickle (.bin) weights, which Fabrica does not write; set it to false "
                     "(safetensors)", where);
    } else if (key == "export_quantization_bit") {
      FAB_USER_CHECK(text == "0", "{}: {}: quantized export (GPTQ) is not implemented in Fabrica; export without it "
                     "and quantize the exported folder with transformers' GPTQConfig", where, text);
    } else if (key == "export_hub_model_id") {
      FAB_USER_CHECK(text.empty(), "{}: uploading to the Hugging Face Hub is not implemented in Fabrica; remove it and "
                     "upload export_dir with `huggingface-cli upload {} EXPORT_DIR`", where, text);
    } else {
      if (key == "finetuning_type") finetuning_type = text;
      y.ignored.push_back(key);
    }
  }
  FAB_USER_CHECK(!y.model_name_or_path.empty(), "{}: export needs model_name_or_path (the base model folder)", path);
  FAB_USER_CHECK(!y.export_dir.empty(), "{}: export needs export_dir (the folder to write)", path);
  FAB_USER_CHECK(y.adapter_name_or_path.empty() || finetuning_type.empty() || finetuning_type == "lora",
                 "{}: finetuning_type {} with adapter_name_or_path: an adapter is merged with finetuning_type lora", path,
                 finetuning_type);
  return y;
}

}  // namespace fab
