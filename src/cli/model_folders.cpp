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

Qwen2VLImageConfig image_processor_of(const std::string& model_dir, const VisionConfig& tower) {
  const std::string path = (fs::path(model_dir) / "preprocessor_config.json").string();
  FAB_USER_CHECK(fs::is_regular_file(path),
                 "{}: images need the model's image processor settings, and this file does not exist (copy it from "
                 "the base model's folder)",
                 path);
  const Qwen2VLImageConfig processor = load_qwen2_vl_image_config(path);
  FAB_USER_CHECK(processor.patch_size == tower.patch_size && processor.temporal_patch_size == tower.temporal_patch_size &&
                     processor.merge_size == tower.spatial_merge_size && tower.in_channels == 3,
                 "{}: patch_size {}, temporal_patch_size {}, merge_size {}, but the model's vision_config has "
                 "patch_size {}, temporal_patch_size {}, spatial_merge_size {}, in_channels {} (expected the same, 3 "
                 "channels)",
                 path, processor.patch_size, processor.temporal_patch_size, processor.merge_size, tower.patch_size,
                 tower.temporal_patch_size, tower.spatial_merge_size, tower.in_channels);
  return processor;
}

}  // namespace fab
