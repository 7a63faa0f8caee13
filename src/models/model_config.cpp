#include "models/model_config.h"

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

}  // namespace

int64_t ModelConfig::num_parameters() const {
  const int64_t c = hidden_size, q = num_attention_heads * head_dim, kv = num_key_value_heads * head_dim;
  int64_t layer = 2 * c + c * (q + 2 * kv) + q * c + 3 * c * intermediate_size;
  if (attention_bias) layer += q + 2 * kv;
  if (qk_norm) layer += 2 * head_dim;
  int64_t total = vocab_size * c + num_hidden_layers * layer + c;
  if (!tie_word_embeddings) total += vocab_size * c;
  return total;
}

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
  FAB_USER_CHECK(c.model_type == "llama" || c.model_type == "mistral" || c.model_type == "qwen2" ||
                     c.model_type == "qwen3",
                 "{}: model_type \"{}\" is not supported (expected llama, mistral, qwen2 or qwen3)", source,
                 c.model_type);
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
  c.attention_bias = c.model_type == "qwen2" || optional<bool>(j, "attention_bias", false, source);
  c.qk_norm = c.model_type == "qwen3";
  if (c.model_type == "mistral") c.sliding_window = optional<int64_t>(j, "sliding_window", 0, source);
  const std::string act = optional<std::string>(j, "hidden_act", "silu", source);
  FAB_USER_CHECK(act == "silu", "{}: hidden_act \"{}\" is not supported (expected silu)", source, act);
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
                                                                    {"qwen3", "Qwen3ForCausalLM"}};
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
  return j.dump(2);
}

}  // namespace fab
