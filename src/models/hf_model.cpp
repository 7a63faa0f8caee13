#include "models/hf_model.h"

#include <cstring>
#include <filesystem>
#include <set>

#include "core/error.h"
#include "core/file_write.h"

namespace fab {
namespace fs = std::filesystem;

void load_weights(DecoderModel& model, const HfWeights& weights) {
  std::set<std::string> known;
  for (const auto& [p, buffer] : model.base_parameters()) {
    known.insert(p->name);
    FAB_USER_CHECK(weights.contains(p->name), "missing tensor \"{}\" {} in the model weights", p->name,
                   shape_str(p->shape));
    const SafetensorsFile& file = weights.file_of(p->name);
    const SafetensorsEntry& e = file.entries().at(p->name);
    FAB_USER_CHECK(e.shape == p->shape, "{}: tensor \"{}\" has shape {} but config.json implies {}", file.path(),
                   p->name, shape_str(e.shape), shape_str(p->shape));
    buffer->set_values(*p, file.as_f32(p->name).data<float>());
  }
  for (const std::string& name : weights.names()) {
    const bool tied_head = name == "lm_head.weight" && model.config().tie_word_embeddings;
    FAB_USER_CHECK(known.count(name) || tied_head, "{}: unexpected tensor \"{}\" for a {} model",
                   weights.file_of(name).path(), name, model.config().model_type);
  }
  model.weights_changed();
}

std::unique_ptr<DecoderModel> load_model_folder(const std::string& folder, const DecoderOptions& options,
                                                uint64_t seed) {
  const ModelConfig config = load_model_config((fs::path(folder) / "config.json").string());
  auto model = std::make_unique<DecoderModel>(config, options);
  if (HfWeights::present(folder))
    load_weights(*model, HfWeights::open(folder));
  else
    model->init_random(seed);
  return model;
}

void save_model_folder(const DecoderModel& model, const std::string& folder, size_t max_shard_bytes) {
  fs::create_directories(folder);
  std::vector<NamedTensor> tensors;
  for (const auto& [p, buffer] : model.base_parameters()) tensors.push_back({p->name, buffer->values_f32(*p)});
  save_hf_weights(folder, tensors, max_shard_bytes);
  write_file_atomically((fs::path(folder) / "config.json").string(), model_config_to_json(model.config()) + "\n");
}

void copy_tokenizer_and_template_files(const std::string& from, const std::string& to) {
  for (const char* name : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                           "tokenizer.model", "vocab.json", "merges.txt", "chat_template.jinja", "chat_template.json",
                           "generation_config.json"}) {
    const fs::path src = fs::path(from) / name;
    if (fs::exists(src)) copy_file_atomically(src.string(), (fs::path(to) / name).string());
  }
}

}  // namespace fab
