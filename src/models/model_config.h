#pragma once
// The decoder family's hyper-parameters, read from a Hugging Face config.json by model_type.
#include <cstdint>
#include <string>

#include "models/rope_scaling.h"

namespace fab {

struct ModelConfig {
  std::string model_type;  // llama | mistral | qwen2 | qwen3
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;
  int64_t max_position_embeddings = 4096;
  int64_t sliding_window = 0;  // mistral; 0 = none
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;  // rope_parameters / rope_scaling of config.json
  double initializer_range = 0.02;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q/k/v biases (always on for qwen2)
  bool qk_norm = false;         // qwen3: RMSNorm on each head of q and k
  // The config.json this came from (empty when built in code): an exported folder writes it
  // back with only what training changed, so every key transformers reads keeps its meaning.
  std::string source_json;

  // Number of parameters (tied embeddings counted once).
  int64_t num_parameters() const;
};

// Parses config.json text; `source` names the file in error messages.
ModelConfig parse_model_config(const std::string& json_text, const std::string& source);
ModelConfig load_model_config(const std::string& path);
std::string model_config_to_json(const ModelConfig& config);

}  // namespace fab
