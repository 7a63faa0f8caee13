#include "models/model_config.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace fab {
namespace {

using nlohmann::json;

template <typename T>
T required(const json& j, const char* key, const std::string& source) {
  FAB_USER_CHECK(j.contains(key) && !j[key].is_null(), "{}: missing field \"{}\"", source, key);
  try {
    return j[key].get<T>();
  } catch (const json::exception&) {
    throw UserError(format("{}: field \"{}\" has the wrong type ({})", source, key, j[key].dump()));
  }
}

template <typename T>
T optional(const json& j, const char* key, T fallback, const std::string& source) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  return required<T>(j, key, source);
}

bool is_moe_type(const std::string& type) {
  return type == "qwen2_moe" || type == "qwen3_moe" || type == "mixtral";
}

// The mixture-of-experts fields of qwen2_moe / qwen3_moe / mixtral, with transformers' defaults.
MoeConfig parse_moe(const json& j, const std::string& type, int64_t layers, int64_t intermediate,
                    const std::string& source) {
  MoeConfig m;
  const bool mixtral = type == "mixtral";
  // transformers maps either name onto the other (qwen3_moe and mixtral save num_local_experts).
  const int64_t fallback = mixtral ? 8 : type == "qwen2_moe" ? 60 : 128;
  const int64_t local = optional<int64_t>(j, "num_local_experts", -1, source);
  const int64_t experts = optional<int64_t>(j, "num_experts", -1, source);
  FAB_USER_CHECK(local < 0 || experts < 0 || local == experts,
                 "{}: num_experts {} and num_local_experts {} disagree", source, experts, local);
  m.num_experts = experts >= 0 ? experts : local >= 0 ? local : fallback;
  m.num_experts_per_tok = optional<int64_t>(j, "num_experts_per_tok", mixtral ? 2 : type == "qwen2_moe" ? 4 : 8,
                                            source);
  m.moe_intermediate_size =
      mixtral ? intermediate : optional<int64_t>(j, "moe_intermediate_size", type == "qwen2_moe" ? 1408 : 768, source);
  if (type == "qwen2_moe")
    m.shared_expert_intermediate_size = optional<int64_t>(j, "shared_expert_intermediate_size", 5632, source);
  m.norm_topk_prob = mixtral || optional<bool>(j, "norm_topk_prob", false, source);
  if (!mixtral) {
    m.decoder_sparse_step = optional<int64_t>(j, "decoder_sparse_step", 1, source);
    m.mlp_only_layers = optional<std::vector<int64_t>>(j, "mlp_only_layers", {}, source);
  }
  m.router_aux_loss_coef = optional<double>(j, "router_aux_loss_coef", 0.001, source);
  m.output_router_logits = optional<bool>(j, "output_router_logits", false, source);
  FAB_USER_CHECK(m.num_experts > 0 && m.moe_intermediate_size > 0 && m.shared_expert_intermediate_size >= 0,
                 "{}: num_experts {} and moe_intermediate_size {} must be positive", source, m.num_experts,
                 m.moe_intermediate_size);
  FAB_USER_CHECK(m.num_experts_per_tok >= 1 && m.num_experts_per_tok <= m.num_experts,
                 "{}: num_experts_per_tok {} must be between 1 and the number of experts ({})", source,
                 m.num_experts_per_tok, m.num_experts);
  FAB_USER_CHECK(m.decoder_sparse_step >= 1, "{}: decoder_sparse_step {} must be at least 1", source,
                 m.decoder_sparse_step);
  for (int64_t layer : m.mlp_only_layers)
    FAB_USER_CHECK(layer >= 0 && layer < layers, "{}: mlp_only_layers names layer {} of {}", source, layer, layers);
  const double jitter = optional<double>(j, "router_jitter_noise", 0.0, source);
  FAB_USER_CHECK(jitter == 0.0,
                 "{}: router_jitter_noise {} is not implemented in Fabrica (set it to 0; transformers applies it only "
                 "in training mode)",
                 source, jitter);
  return m;
}

void add_moe_fields(const ModelConfig& c, json& j) {
  const MoeConfig& m = c.moe;
  j[c.model_type == "mixtral" ? "num_local_experts" : "num_experts"] = m.num_experts;
  j["num_experts_per_tok"] = m.num_experts_per_tok;
  j["router_aux_loss_coef"] = m.router_aux_loss_coef;
  j["output_router_logits"] = m.output_router_logits;
  if (c.model_type == "mixtral") return;
  j["moe_intermediate_size"] = m.moe_intermediate_size;
  j["norm_topk_prob"] = m.norm_topk_prob;
  j["decoder_sparse_step"] = m.decoder_sparse_step;
  j["mlp_only_layers"] = m.mlp_only_layers;
  if (c.model_type == "qwen2_moe") j["shared_expert_intermediate_size"] = m.shared_expert_intermediate_size;
}

}  // namespace

bool ModelConfig::is_moe_layer(int64_t layer) const {
  if (!moe.enabled() || (layer + 1) % moe.decoder_sparse_step != 0) return false;
  return std::find(moe.mlp_only_layers.begin(), moe.mlp_only_layers.end(), layer) == moe.mlp_only_layers.end();
}

int64_t ModelConfig::num_parameters() const {
  const int64_t c = hidden_size, q = num_attention_heads * head_dim, kv = num_key_value_heads * head_dim;
  int64_t attention = 2 * c + c * (q + 2 * kv) + q * c;
  if (attention_bias) attention += q + 2 * kv;
  if (qk_norm) attention += 2 * head_dim;
  const int64_t dense_mlp = 3 * c * intermediate_size;
  int64_t moe_mlp = moe.num_experts * (c + 3 * c * moe.moe_intermediate_size);  // router row + expert
  if (moe.shared_expert_intermediate_size) moe_mlp += 3 * c * moe.shared_expert_intermediate_size + c;
  int64_t total = vocab_size * c + c;
  for (int64_t i = 0; i < num_hidden_layers; ++i) total += attention + (is_moe_layer(i) ? moe_mlp : dense_mlp);
  if (!tie_word_embeddings) total += vocab_size * c;
  return total + (vision ? vision->num_parameters() : 0);
}

int64_t VisionConfig::num_parameters() const {
  const int64_t e = width, i = intermediate, norm = qwen2_5 ? e : 2 * e, merged = e * merge_unit();
  const int64_t mlp = qwen2_5 ? 3 * e * i + 2 * i + e : 2 * e * i + i + e;
  const int64_t block = 2 * norm + 3 * e * e + 3 * e + e * e + e + mlp;
  return e * patch_values() + depth * block + norm + merged * merged + merged + out_hidden_size * (merged + 1);
}

namespace {

// The decoder's hyper-parameters from `j` (config.json itself, or a VLM's text config).
void parse_decoder(const json& j, const std::string& source, ModelConfig& c) {
  c.vocab_size = required<int64_t>(j, "vocab_size", source);
  c.hidden_size = required<int64_t>(j, "hidden_size", source);
  c.intermediate_size = required<int64_t>(j, "intermediate_size", source);
  c.num_hidden_layers = required<int64_t>(j, "num_hidden_layers", source);
  c.num_attention_heads = required<int64_t>(j, "num_attention_heads", source);
  c.num_key_value_heads = optional<int64_t>(j, "num_key_value_heads", c.num_attention_heads, source);
  FAB_USER_CHECK(c.vocab_size > 0 && c.hidden_size > 0 && c.intermediate_size > 0 && c.num_hidden_layers > 0 &&
                     c.num_attention_heads > 0 && c.num_key_value_heads > 0,
                 "{}: sizes must be positive", source);
  c.head_dim = optional<int64_t>(j, "head_dim", c.hidden_size / c.num_attention_heads, source);
  FAB_USER_CHECK(c.head_dim > 0 && c.head_dim % 2 == 0, "{}: head_dim {} must be positive and even", source,
                 c.head_dim);
  FAB_USER_CHECK(c.num_attention_heads % c.num_key_value_heads == 0,
                 "{}: num_attention_heads {} is not a multiple of num_key_value_heads {}", source,
                 c.num_attention_heads, c.num_key_value_heads);
  c.max_position_embeddings = optional<int64_t>(j, "max_position_embeddings", c.max_position_embeddings, source);
  c.rms_norm_eps = optional<double>(j, "rms_norm_eps", c.rms_norm_eps, source);
  parse_rope(j, source, c.max_position_embeddings, &c.rope_theta, &c.rope_scaling);
  c.initializer_range = optional<double>(j, "initializer_range", c.initializer_range, source);
  c.tie_word_embeddings = optional<bool>(j, "tie_word_embeddings", false, source);
  const bool qwen2_family = c.model_type == "qwen2" || c.vision.has_value();
  c.attention_bias = qwen2_family || optional<bool>(j, "attention_bias", false, source);
  if (c.model_type == "qwen2_moe") c.attention_bias = optional<bool>(j, "qkv_bias", true, source);
  c.qk_norm = c.model_type == "qwen3" || c.model_type == "qwen3_moe";
  if (is_moe_type(c.model_type)) c.moe = parse_moe(j, c.model_type, c.num_hidden_layers, c.intermediate_size, source);
  if (c.model_type == "mistral" || c.model_type == "mixtral") c.sliding_window = optional<int64_t>(j, "sliding_window", 0, source);
  const std::string act = optional<std::string>(j, "hidden_act", "silu", source);
  FAB_USER_CHECK(act == "silu", "{}: hidden_act \"{}\" is not supported (expected silu)", source, act);
}

// vision_config of qwen2_vl (embed_dim, mlp_ratio, hidden_size: the merger's output) or
// qwen2_5_vl (hidden_size, intermediate_size, out_hidden_size, window_size, fullatt_block_indexes).
VisionConfig parse_vision(const json& j, bool qwen2_5, const std::string& source) {
  const std::string where = source + ": vision_config";
  FAB_USER_CHECK(j.is_object(), "{}: vision_config must be an object", source);
  VisionConfig v;
  v.qwen2_5 = qwen2_5;
  v.depth = required<int64_t>(j, "depth", where);
  v.num_heads = required<int64_t>(j, "num_heads", where);
  if (qwen2_5) {
    v.width = required<int64_t>(j, "hidden_size", where);
    v.intermediate = required<int64_t>(j, "intermediate_size", where);
    v.out_hidden_size = required<int64_t>(j, "out_hidden_size", where);
    v.window_size = optional<int64_t>(j, "window_size", 112, where);
    v.fullatt_block_indexes = optional<std::vector<int64_t>>(j, "fullatt_block_indexes", {}, where);
  } else {
    v.width = required<int64_t>(j, "embed_dim", where);
    v.intermediate = int64_t(double(v.width) * optional<double>(j, "mlp_ratio", 4.0, where));
    v.out_hidden_size = required<int64_t>(j, "hidden_size", where);
  }
  v.in_channels = optional<int64_t>(j, "in_channels", optional<int64_t>(j, "in_chans", 3, where), where);
  v.patch_size = optional<int64_t>(j, "patch_size", optional<int64_t>(j, "spatial_patch_size", 14, where), where);
  v.temporal_patch_size = optional<int64_t>(j, "temporal_patch_size", 2, where);
  v.spatial_merge_size = optional<int64_t>(j, "spatial_merge_size", 2, where);
  v.initializer_range = optional<double>(j, "initializer_range", 0.02, where);
  v.rope_theta = optional<double>(j, "rope_theta", 10000.0, where);
  if (j.contains("rope_parameters") && j["rope_parameters"].is_object())
    v.rope_theta = optional<double>(j["rope_parameters"], "rope_theta", v.rope_theta, where);
  FAB_USER_CHECK(v.depth > 0 && v.width > 0 && v.num_heads > 0 && v.intermediate > 0 && v.out_hidden_size > 0 &&
                     v.patch_size > 0 && v.temporal_patch_size > 0 && v.spatial_merge_size > 0 && v.in_channels > 0,
                 "{}: sizes must be positive", where);
  FAB_USER_CHECK(v.width % v.num_heads == 0 && v.head_dim() % 4 == 0,
                 "{}: the width {} must split into num_heads {} heads of a multiple of 4 features", where, v.width,
                 v.num_heads);
  for (int64_t i : v.fullatt_block_indexes)
    FAB_USER_CHECK(i >= 0 && i < v.depth, "{}: fullatt_block_indexes holds {}, outside the {} blocks", where, i,
                   v.depth);
  FAB_USER_CHECK(!qwen2_5 || v.window_size % (v.patch_size * v.spatial_merge_size) == 0,
                 "{}: window_size {} must be a multiple of patch_size * spatial_merge_size", where, v.window_size);
  const std::string act = optional<std::string>(j, "hidden_act", qwen2_5 ? "silu" : "quick_gelu", where);
  FAB_USER_CHECK(act == (qwen2_5 ? "silu" : "quick_gelu"), "{}: hidden_act \"{}\" is not supported (expected {})",
                 where, act, qwen2_5 ? "silu" : "quick_gelu");
  return v;
}

// mrope_section from the text config's rope_parameters (transformers 5) or rope_scaling (4).
std::vector<int64_t> parse_mrope_section(const json& t, const ModelConfig& c, const std::string& source) {
  std::vector<int64_t> section;
  for (const char* key : {"rope_parameters", "rope_scaling"})
    if (t.contains(key) && t[key].is_object() && t[key].contains("mrope_section")) {
      section = required<std::vector<int64_t>>(t[key], "mrope_section", source + ": " + key);
      break;
    }
  int64_t sum = 0;
  for (int64_t s : section) sum += s;
  FAB_USER_CHECK(section.size() == 3 && sum == c.head_dim / 2,
                 "{}: rope_parameters.mrope_section must be three counts (temporal, height, width) summing to "
                 "head_dim / 2 = {}, got {}",
                 source, c.head_dim / 2, nlohmann::json(section).dump());
  return section;
}

// A VLM's config: the text keys nested in text_config (transformers 5) or at the top level
// (transformers 4's flat form), the tower in vision_config.
void parse_vision_language(const json& j, const std::string& source, ModelConfig& c) {
  FAB_USER_CHECK(j.contains("vision_config"), "{}: missing field \"vision_config\" for model_type {}", source,
                 c.model_type);
  c.vision = parse_vision(j["vision_config"], c.model_type == "qwen2_5_vl", source);
  json text = j;
  text.erase("vision_config");
  if (j.contains("text_config") && j["text_config"].is_object()) {
    text.erase("text_config");
    for (const auto& [key, value] : j["text_config"].items()) text[key] = value;
  }
  parse_decoder(text, source, c);
  // transformers 5: the top level's tie_word_embeddings, or text_config's when that one is set.
  c.tie_word_embeddings = optional<bool>(j, "tie_word_embeddings", false, source) ||
                          optional<bool>(text, "tie_word_embeddings", false, source);
  // Qwen2VLTextConfig.default_theta when the config names none.
  const bool has_theta = text.contains("rope_theta") ||
                         (text.contains("rope_parameters") && text["rope_parameters"].contains("rope_theta")) ||
                         (text.contains("rope_scaling") && text["rope_scaling"].is_object() &&
                          text["rope_scaling"].contains("rope_theta"));
  if (!has_theta) c.rope_theta = 1000000.0;
  FAB_USER_CHECK(!optional<bool>(text, "use_sliding_window", false, source),
                 "{}: use_sliding_window is not supported for {}", source, c.model_type);
  c.mrope_section = parse_mrope_section(text, c, source);
  FAB_USER_CHECK(c.vision->out_hidden_size == c.hidden_size,
                 "{}: the vision merger's output ({}) must equal the language model's hidden_size {}", source,
                 c.vision->out_hidden_size, c.hidden_size);
  c.image_token_id = required<int64_t>(text, "image_token_id", source);
  c.video_token_id = optional<int64_t>(text, "video_token_id", -1, source);
  c.vision_start_token_id = optional<int64_t>(text, "vision_start_token_id", -1, source);
  FAB_USER_CHECK(c.image_token_id >= 0 && c.image_token_id < c.vocab_size,
                 "{}: image_token_id {} outside the vocabulary of {}", source, c.image_token_id, c.vocab_size);
}

}  // namespace

ModelConfig parse_model_config(const std::string& text, const std::string& source) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw UserError(format("{}: not valid JSON ({})", source, e.what()));
  }
  FAB_USER_CHECK(j.is_object(), "{}: expected a JSON object", source);
  ModelConfig c;
  c.model_type = required<std::string>(j, "model_type", source);
  const bool vision_language = c.model_type == "qwen2_vl" || c.model_type == "qwen2_5_vl";
  FAB_USER_CHECK(vision_language || c.model_type == "llama" || c.model_type == "mistral" ||
                     c.model_type == "qwen2" || c.model_type == "qwen3" || is_moe_type(c.model_type),
                 "{}: model_type \"{}\" is not supported (expected llama, mistral, qwen2, qwen3, qwen2_moe, "
                 "qwen3_moe, mixtral, qwen2_vl or qwen2_5_vl)",
                 source, c.model_type);
  if (vision_language) parse_vision_language(j, source, c);
  else parse_decoder(j, source, c);
  c.source_json = text;
  return c;
}

ModelConfig load_model_config(const std::string& path) {
  std::ifstream in(path);
  FAB_USER_CHECK(in, "{}: cannot open", path);
  std::stringstream text;
  text << in.rdbuf();
  return parse_model_config(text.str(), path);
}

std::string model_config_to_json(const ModelConfig& c) {
  if (!c.source_json.empty()) {
    // The source's keys as they were (eos/pad ids, rope_parameters, architectures, ...); the
    // weights written beside it are fp32.
    json j = json::parse(c.source_json);
    if (j.contains("dtype")) j["dtype"] = "float32";  // transformers 5's name for torch_dtype
    else j["torch_dtype"] = "float32";
    return j.dump(2);
  }
  static const std::map<std::string, std::string> kArchitecture = {{"llama", "LlamaForCausalLM"},
                                                                    {"mistral", "MistralForCausalLM"},
                                                                    {"qwen2", "Qwen2ForCausalLM"},
                                                                    {"qwen3", "Qwen3ForCausalLM"},
                                                                    {"qwen2_moe", "Qwen2MoeForCausalLM"},
                                                                    {"qwen3_moe", "Qwen3MoeForCausalLM"},
                                                                    {"mixtral", "MixtralForCausalLM"}};
  json j = {{"architectures", {kArchitecture.at(c.model_type)}},
            {"model_type", c.model_type},
            {"vocab_size", c.vocab_size},
            {"hidden_size", c.hidden_size},
            {"intermediate_size", c.intermediate_size},
            {"num_hidden_layers", c.num_hidden_layers},
            {"num_attention_heads", c.num_attention_heads},
            {"num_key_value_heads", c.num_key_value_heads},
            {"head_dim", c.head_dim},
            {"max_position_embeddings", c.max_position_embeddings},
            {"rms_norm_eps", c.rms_norm_eps},
            {"rope_theta", c.rope_theta},
            {"initializer_range", c.initializer_range},
            {"tie_word_embeddings", c.tie_word_embeddings},
            {"attention_bias", c.attention_bias},
            {"hidden_act", "silu"},
            {"torch_dtype", "float32"}};
  if (c.sliding_window) j["sliding_window"] = c.sliding_window;
  if (c.is_moe()) add_moe_fields(c, j);
  return j.dump(2);
}

}  // namespace fab
