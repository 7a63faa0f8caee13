#include "models/hf_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <optional>
#include <set>
#include <vector>

#include "core/error.h"
#include "core/file_write.h"
#include "core/rng.h"
#include "models/moe_weights.h"

namespace fab {
namespace fs = std::filesystem;

namespace {

// This rank's slice of a whole HF tensor (rows or columns [begin, begin + length), those past the
// tensor's end left as they are, zero: the padding of a vocabulary tensor parallel does not divide).
void copy_slice(const Tensor& full, const ShardSpec& s, float* dst) {
  // Rows are the first dimension's: a fused experts block (E, out, in) is E rows of out * in.
  const int64_t rows = s.full_shape[0], cols = full.numel() / rows;
  const float* src = full.data<float>();
  if (s.split_dim == 0) {
    const int64_t n = std::clamp<int64_t>(rows - s.begin, 0, s.length);
    std::memcpy(dst, src + s.begin * cols, size_t(n * cols) * sizeof(float));
    return;
  }
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(dst + r * s.length, src + r * cols + s.begin, size_t(s.length) * sizeof(float));
}

// A VLM's tensors in a folder: transformers 5 names the language model model.language_model.*
// and the tower model.visual.*; the released checkpoints (transformers 4) model.* and visual.*.
// Inside Fabrica the language model is model.* and the tower model.visual.*.
constexpr const char* kLanguageModelPrefix = "model.language_model.";

std::string starts_after(const std::string& name, const std::string& prefix) {
  return name.rfind(prefix, 0) == 0 ? name.substr(prefix.size()) : std::string();
}

// The name `name` has in a folder of either generation that holds it (the first when none does).
std::string stored_name(const ModelConfig& c, const HfWeights& weights, const std::string& name) {
  if (!c.vision || weights.contains(name)) return name;
  if (is_vision_parameter(name)) return name.substr(std::string("model.").size());  // visual.*
  const std::string rest = starts_after(name, "model.");
  return rest.empty() ? name : kLanguageModelPrefix + rest;
}

// Fabrica's name of a VLM tensor stored under `stored` (either generation's).
std::string internal_name(const ModelConfig& c, const std::string& stored) {
  if (!c.vision) return stored;
  if (stored.rfind("visual.", 0) == 0) return "model." + stored;
  const std::string rest = starts_after(stored, kLanguageModelPrefix);
  return rest.empty() ? stored : "model." + rest;
}


constexpr const char* kValueHeadFile = "value_head.safetensors";  // LLaMA-Factory's V_HEAD_SAFE_WEIGHTS_NAME

bool is_value_head(const std::string& name) { return name.rfind("v_head.", 0) == 0; }

// A fresh value head as torch's nn.Linear(C, 1) starts (TRL's ValueHead default): U(-1/√C, 1/√C)
// for weight and bias, from the run's seed.
void init_value_head(DecoderModel& model, uint64_t seed) {
  ParamBuffer& params = model.params();
  Rng rng(seed ^ 0x76686561645f5f5full);  // "vhead__": apart from the model's own init stream
  const double bound = 1.0 / std::sqrt(double(model.config().hidden_size));
  for (const char* name : {"v_head.summary.weight", "v_head.summary.bias"}) {
    const ParamInfo& p = params.info(name);
    std::vector<float> values(size_t(p.numel()));
    for (float& v : values) v = float((2 * rng.uniform() - 1) * bound);
    params.set_values(p, values.data());
  }
}

}  // namespace

std::string saved_name(const ModelConfig& c, const std::string& name) {
  if (!c.vision || is_vision_parameter(name)) return name;
  const std::string rest = starts_after(name, "model.");
  return rest.empty() ? name : kLanguageModelPrefix + rest;
}

void save_value_head(const DecoderModel& model, const std::string& folder) {
  const ParamBuffer& params = model.params();
  std::vector<NamedTensor> value_head;
  for (const char* name : {"v_head.summary.weight", "v_head.summary.bias"}) {
    const ParamInfo& p = params.info(name);
    value_head.push_back({name, params.values_f32(p)});
  }
  save_safetensors((fs::path(folder) / kValueHeadFile).string(), value_head, {{"format", "pt"}});
}

bool load_value_head(DecoderModel& model, const std::string& folder) {
  ParamBuffer& params = model.params();
  const fs::path file = fs::path(folder) / kValueHeadFile;
  if (!fs::exists(file)) return false;
  const SafetensorsFile f = SafetensorsFile::open(file.string());
  for (const char* name : {"v_head.summary.weight", "v_head.summary.bias"}) {
    const ParamInfo& p = params.info(name);
    FAB_USER_CHECK(f.contains(name), "{}: missing tensor \"{}\"", file.string(), name);
    FAB_USER_CHECK(f.entries().at(name).shape == p.shape, "{}: tensor \"{}\" has shape {}, expected {}",
                   file.string(), name, shape_str(f.entries().at(name).shape), shape_str(p.shape));
    params.set_values(p, f.as_f32(name).data<float>());
  }
  return true;
}

void load_weights(DecoderModel& model, const HfWeights& weights) {
  std::set<std::string> known;
  for (const auto& [p, buffer] : model.base_parameters()) {
    known.insert(p->name);
    // LLaMA-Factory keeps the value head beside the weights (value_head.safetensors), TRL in them.
    if (is_value_head(p->name) && !weights.contains(p->name)) continue;
    // This rank's slice (tensor parallel; a fused experts block's experts under expert parallel).
    const ShardSpec s = model.held_slice(*p, *buffer);
    const std::string stored = stored_name(model.config(), weights, p->name);
    FAB_USER_CHECK(weights.contains(stored), "missing tensor \"{}\" {} in the model weights", stored,
                   shape_str(s.full_shape));
    const SafetensorsFile& file = weights.file_of(stored);
    const SafetensorsEntry& e = file.entries().at(stored);
    FAB_USER_CHECK(e.shape == s.full_shape, "{}: tensor \"{}\" has shape {} but config.json implies {}", file.path(),
                   stored, shape_str(e.shape), shape_str(s.full_shape));
    const Tensor t = file.as_f32(stored);
    if (s.split_dim < 0) {
      buffer->set_values(*p, t.data<float>());
    } else {  // this rank's slice, on the host first (the buffer may be a device's)
      std::vector<float> slice(static_cast<size_t>(p->numel()), 0.0f);
      copy_slice(t, s, slice.data());
      buffer->set_values(*p, slice.data());
    }
  }
  for (const std::string& name : weights.names()) {
    const bool tied_head = name == "lm_head.weight" && model.config().tie_word_embeddings;
    // A pipeline stage holds only its part of the model's tensors.
    const std::string internal = internal_name(model.config(), name);
    FAB_USER_CHECK(known.count(internal) || tied_head || !model.is_whole() || model.held_elsewhere(internal),
                   "{}: unexpected tensor \"{}\" for a {} model",
                   weights.file_of(name).path(), name, model.config().model_type);
  }
  model.weights_changed();
}

std::unique_ptr<DecoderModel> load_model_folder(const std::string& folder, const DecoderOptions& options,
                                                uint64_t seed) {
  ModelConfig config = load_model_config((fs::path(folder) / "config.json").string());
  std::optional<HfWeights> weights;
  if (HfWeights::present(folder)) weights = HfWeights::open(folder);
  // A mixture of experts keeps the layout its folder has (and exports it).
  if (config.is_moe() && weights) config.moe.fused_experts = detect_fused_experts(config, *weights);
  auto model = std::make_unique<DecoderModel>(config, options);
  bool value_head_loaded = false;
  if (weights) {
    load_weights(*model, *weights);
    value_head_loaded = weights->contains("v_head.summary.weight");
  } else {
    model->init_random(seed);
  }
  if (options.value_head && !value_head_loaded && !load_value_head(*model, folder)) init_value_head(*model, seed);
  model->weights_changed();
  return model;
}

void save_model_folder(const DecoderModel& model, const std::string& folder, size_t max_shard_bytes) {
  FAB_CHECK(model.is_whole(), "a pipeline stage's weights are saved through PipelineParallel::gather_weights");
  FAB_CHECK(model.sharding().size() == 1, "a tensor-parallel model is saved from its gathered tensors");
  std::vector<NamedTensor> tensors;
  for (const auto& [p, buffer] : model.base_parameters()) tensors.push_back({p->name, buffer->values_f32(*p)});
  save_model_folder(model.config(), tensors, folder, max_shard_bytes);
}

void save_model_folder(const ModelConfig& config, const std::vector<NamedTensor>& tensors, const std::string& folder,
                       size_t max_shard_bytes) {
  fs::create_directories(folder);
  std::vector<NamedTensor> weights, value_head;  // the value head goes beside, as LLaMA-Factory saves it
  for (const NamedTensor& t : tensors)
    (is_value_head(t.name) ? value_head : weights).push_back({saved_name(config, t.name), t.tensor});
  save_hf_weights(folder, weights, max_shard_bytes);
  if (!value_head.empty())
    save_safetensors((fs::path(folder) / kValueHeadFile).string(), value_head, {{"format", "pt"}});
  write_file_atomically((fs::path(folder) / "config.json").string(), model_config_to_json(config) + "\n");
}

void copy_tokenizer_and_template_files(const std::string& from, const std::string& to) {
  for (const char* name : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                           "tokenizer.model", "vocab.json", "merges.txt", "chat_template.jinja", "chat_template.json",
                           "generation_config.json", "preprocessor_config.json", "processor_config.json"}) {
    const fs::path src = fs::path(from) / name;
    if (fs::exists(src)) copy_file_atomically(src.string(), (fs::path(to) / name).string());
  }
}

}  // namespace fab
