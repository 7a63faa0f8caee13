#pragma once
// RoPE frequencies from a Hugging Face config.json, as transformers computes them at model init
// (modeling_rope_utils.ROPE_INIT_FUNCTIONS): the inverse frequency of each rotary pair and the
// factor cos and sin are multiplied by (yarn's attention scaling; 1 otherwise).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace fab {

struct RopeScaling {
  std::string type = "default";  // default | linear | dynamic | yarn | llama3
  double factor = 1.0;
  int64_t original_max_position_embeddings = 0;      // llama3, yarn
  double low_freq_factor = 1.0, high_freq_factor = 4.0;  // llama3
  double beta_fast = 32.0, beta_slow = 1.0;           // yarn
  bool truncate = true;                               // yarn
  std::optional<double> attention_factor, mscale, mscale_all_dim;  // yarn
};

// Reads rope_theta and the scaling from a config.json object: transformers 5's
// `rope_parameters: {rope_type, rope_theta, ...}`, or transformers 4's top-level `rope_theta` with
// `rope_scaling: {type|rope_type, factor, ...}`. Unsupported types and partial rotary factors
// are a UserError naming `source`.
void parse_rope(const nlohmann::json& config, const std::string& source, int64_t max_position_embeddings,
                double* rope_theta, RopeScaling* scaling);

struct RopeFrequencies {
  std::vector<float> inv_freq;  // head_dim / 2
  float attention_scaling = 1.0f;
};

RopeFrequencies rope_frequencies(int64_t head_dim, double theta, const RopeScaling& scaling);

}  // namespace fab
