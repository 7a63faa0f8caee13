#include "models/hf_model.h"

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "core/file_write.h"

namespace fab {
namespace fs = std::filesystem;

namespace {

// This rank's slice of a whole HF tensor (rows or columns [begin, begin + length), those past the
// tensor's end left zero: the padding of a vocabulary tensor parallel does not divide).
void copy_slice(const Tensor& full, const ShardSpec& s, float* dst) {
  const int64_t rows = s.full_shape[0], cols = s.full_shape.size() > 1 ? s.full_shape[1] : 1;
  const float* src = full.data<float>();
  if (s.split_dim == 0) {
    const int64_t n = std::clamp<int64_t>(rows - s.begin, 0, s.length);
    std::memcpy(dst, src + s.begin * cols, size_t(n * cols) * sizeof(float));
    return;
  }
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(dst + r * s.length, src + r * cols + s.begin, size_t(s.length) * sizeof(float));
}

}  // namespace

void load_weights(DecoderModel& model, const HfWeights& weights) {
  ParamBuffer& params = model.params();
  for (size_t i = 0; i < params.params().size(); ++i) {
    const ParamInfo& p = params.params()[i];
    const ShardSpec& s = model.shard(i);
    FAB_USER_CHECK(weights.contains(p.name), "missing tensor \"{}\" {} in the model weights", p.name,
                   shape_str(s.full_shape));
    const SafetensorsFile& file = weights.file_of(p.name);
    const SafetensorsEntry& e = file.entries().at(p.name);
    FAB_USER_CHECK(e.shape == s.full_shape, "{}: tensor \"{}\" has shape {} but config.json implies {}", file.path(),
                   p.name, shape_str(e.shape), shape_str(s.full_shape));
    Tensor t = file.as_f32(p.name);
    float* dst = params.values().data<float>() + p.offset;
    if (s.split_dim < 0)
      std::memcpy(dst, t.data<float>(), t.bytes());
    else
      copy_slice(t, s, dst);
  }
  for (const std::string& name : weights.names()) {
    const bool tied_head = name == "lm_head.weight" && model.config().tie_word_embeddings;
    FAB_USER_CHECK(params.contains(name) || tied_head, "{}: unexpected tensor \"{}\" for a {} model",
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
  FAB_CHECK(!model.options().tp, "a tensor-parallel model is saved from its gathered tensors");
  std::vector<NamedTensor> tensors;
  const ParamBuffer& params = model.params();
  for (const ParamInfo& p : params.params()) tensors.push_back({p.name, params.values().view(p.offset, p.shape)});
  save_model_folder(model.config(), tensors, folder, max_shard_bytes);
}

void save_model_folder(const ModelConfig& config, const std::vector<NamedTensor>& tensors, const std::string& folder,
                       size_t max_shard_bytes) {
  fs::create_directories(folder);
  save_hf_weights(folder, tensors, max_shard_bytes);
  write_file_atomically((fs::path(folder) / "config.json").string(), model_config_to_json(config) + "\n");
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
