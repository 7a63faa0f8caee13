#pragma once
// The YAML of `fabrica export EXPORT.yaml`: llamafactory-cli export's keys (LLaMA-Factory's
// examples/merge_lora/*.yaml). Every key is read or refused: unknown keys, a key set twice and
// the settings Fabrica cannot honour (export_quantization_bit, export_legacy_format: true,
// export_hub_model_id) are a UserError naming the file, the line and the key.
#include <cstdint>
#include <string>
#include <vector>

namespace fab {

struct ExportYaml {
  std::string model_name_or_path, adapter_name_or_path, export_dir;
  int64_t export_size = 5;           // GB per weight file (LLaMA-Factory's default 5)
  std::vector<std::string> ignored;  // keys read that change nothing here (template, export_device, ...)
};

ExportYaml load_export_yaml(const std::string& path);

}  // namespace fab
