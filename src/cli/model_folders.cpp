#include "cli/model_folders.h"

#include <filesystem>

#include "core/error.h"
#include "models/peft_adapter.h"

namespace fab {
namespace fs = std::filesystem;

void require_folder(const std::string& what, const std::string& dir) {
  FAB_USER_CHECK(fs::exists(dir), "{} {}: no such folder", what, dir);
  FAB_USER_CHECK(fs::is_directory(dir), "{} {}: not a folder (expected a model folder)", what, dir);
}

std::string adapter_base_model(const std::string& adapter_dir) {
  std::string base;
  try {
    read_adapter_config(adapter_dir, &base);
  } catch (const UserError&) {
    return "";
  }
  return base;
}

void require_model_folder(const std::string& what, const std::string& dir) {
  require_folder(what, dir);
  if (is_adapter_folder(dir)) {
    const std::string base = adapter_base_model(dir);
    throw UserError(format("{} {}: this is a LoRA adapter (adapter_config.json), not a model: use --model {} "
                           "--adapter {}",
                           what, dir, base.empty() ? "BASE_MODEL_DIR" : base, dir));
  }
  FAB_USER_CHECK(fs::exists(fs::path(dir) / "config.json"),
                 "{} {}: no config.json there (expected a Hugging Face model folder)", what, dir);
}

bool has_tokenizer(const std::string& dir) {
  return fs::exists(fs::path(dir) / "tokenizer.json") || fs::exists(fs::path(dir) / "tokenizer.model");
}

}  // namespace fab
