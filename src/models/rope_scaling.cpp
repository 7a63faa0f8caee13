#include "models/rope_scaling.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "nn/ops.h"

namespace fab {
namespace {

using nlohmann::json;

double number(const json& params, const char* key, double fallback, const std::string& source) {
  if (!params.contains(key) || params[key].is_null()) return fallback;
  FAB_USER_CHECK(params[key].is_number(), "{}: rope parameter \"{}\" must be a number, not {}", source, key,
                 params[key].dump());
  return params[key].get<double>();
}

std::optional<double> maybe_number(const json& params, const char* key, const std::string& source) {
  if (!params.contains(key) || params[key].is_null()) return std::nullopt;
  return number(params, key, 0.0, source);
}

// The rope dict of either transformers generation; an empty object when there is none.
json rope_dict(const json& config, const std::string& source) {
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    if (!config.contains(key) || config[key].is_null()) continue;
    FAB_USER_CHECK(config[key].is_object(), "{}: \"{}\" must be an object, not {}", source, key, config[key].dump());
    for (const auto& [name, value] : config[key].items())
      FAB_USER_CHECK(!value.is_object(), "{}: \"{}\" holds RoPE parameters per layer type (\"{}\"), which the llama, "
                     "mistral, qwen2 and qwen3 families do not use", source, key, name);
    return config[key];
  }
  return json::object();
}

// Llama 3.1: wavelengths longer than original/low_freq_factor are divided by factor, shorter than
// original/high_freq_factor kept, and the band between interpolated smoothly. In fp32, as torch.
void apply_llama3(std::vector<float>& f, const RopeScaling& s) {
  const float old_len = float(s.original_max_position_embeddings), factor = float(s.factor);
  const float low = float(s.low_freq_factor), high = float(s.high_freq_factor);
  const float low_wavelen = old_len / low, high_wavelen = old_len / high;
  for (float& x : f) {
    const float wavelen = float(2 * std::numbers::pi) / x;
    if (wavelen > low_wavelen) {
      x = x / factor;
    } else if (!(wavelen < high_wavelen)) {
      const float smooth = (old_len / wavelen - low) / (high - low);
      x = (1 - smooth) * x / factor + smooth * x;
    }
  }
}

double yarn_mscale(double scale, double mscale) { return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0; }

// YaRN: per pair, a ramp between extrapolation (the plain frequency, high-frequency pairs) and
// interpolation (divided by factor, low-frequency pairs) over the correction range of
// [beta_fast, beta_slow] rotations within the original context; cos/sin scaled by mscale.
RopeFrequencies yarn(int64_t d, double theta, const RopeScaling& s) {
  auto correction_dim = [&](double rotations) {
    return double(d) * std::log(double(s.original_max_position_embeddings) / (rotations * 2 * std::numbers::pi)) /
           (2 * std::log(theta));
  };
  double low = correction_dim(s.beta_fast), high = correction_dim(s.beta_slow);
  if (s.truncate) low = std::floor(low), high = std::ceil(high);
  low = std::max(low, 0.0), high = std::min(high, double(d - 1));
  if (low == high) high += 0.001;
  RopeFrequencies r{std::vector<float>(size_t(d / 2)), 1.0f};
  for (int64_t j = 0; j < d / 2; ++j) {  // in fp32, as torch
    const float pos_freq = float(std::pow(theta, double(float(2 * j) / float(d))));
    const float extrapolation = 1.0f / pos_freq, interpolation = 1.0f / (float(s.factor) * pos_freq);
    const float ramp = std::clamp((float(j) - float(low)) / (float(high) - float(low)), 0.0f, 1.0f);
    const float extrapolation_weight = 1.0f - ramp;
    r.inv_freq[size_t(j)] = interpolation * (1 - extrapolation_weight) + extrapolation * extrapolation_weight;
  }
  if (s.attention_factor) r.attention_scaling = float(*s.attention_factor);
  else if (s.mscale && s.mscale_all_dim && *s.mscale && *s.mscale_all_dim)
    r.attention_scaling = float(yarn_mscale(s.factor, *s.mscale) / yarn_mscale(s.factor, *s.mscale_all_dim));
  else r.attention_scaling = float(yarn_mscale(s.factor, 1.0));
  return r;
}

}  // namespace

void parse_rope(const json& config, const std::string& source, int64_t max_position_embeddings, double* rope_theta,
                RopeScaling* s) {
  const json params = rope_dict(config, source);
  *rope_theta = number(params, "rope_theta", number(config, "rope_theta", 10000.0, source), source);
  FAB_USER_CHECK(*rope_theta > 1, "{}: rope_theta {} must be greater than 1", source, *rope_theta);
  const double partial = number(params, "partial_rotary_factor", number(config, "partial_rotary_factor", 1.0, source),
                                source);
  FAB_USER_CHECK(partial == 1.0, "{}: partial_rotary_factor {} is not supported (RoPE over the whole head)", source,
                 partial);
  std::string type = "default";
  for (const char* key : {"rope_type", "type"})
    if (params.contains(key) && params[key].is_string()) type = params[key].get<std::string>();
  if (type == "mrope") type = "default";  // qwen2_vl's transformers-4 name (its config turns it into default)
  FAB_USER_CHECK(type == "default" || type == "linear" || type == "dynamic" || type == "yarn" || type == "llama3",
                 "{}: rope_type \"{}\" is not supported (expected default, linear, dynamic, yarn or llama3)", source,
                 type);
  s->type = type;
  if (type == "default") return;
  // A top-level original_max_position_embeddings wins, as in transformers (Phi-3 keeps it there).
  s->original_max_position_embeddings = int64_t(number(
      config, "original_max_position_embeddings",
      number(params, "original_max_position_embeddings", double(max_position_embeddings), source), source));
  FAB_USER_CHECK(s->original_max_position_embeddings > 0, "{}: original_max_position_embeddings must be positive",
                 source);
  const bool factor_optional = type == "yarn";  // yarn: max_position_embeddings / original
  FAB_USER_CHECK(factor_optional || (params.contains("factor") && !params["factor"].is_null()),
                 "{}: rope_type \"{}\" needs \"factor\"", source, type);
  s->factor = number(params, "factor",
                     double(max_position_embeddings) / double(s->original_max_position_embeddings), source);
  FAB_USER_CHECK(s->factor > 0, "{}: RoPE factor {} must be positive", source, s->factor);
  s->low_freq_factor = number(params, "low_freq_factor", s->low_freq_factor, source);
  s->high_freq_factor = number(params, "high_freq_factor", s->high_freq_factor, source);
  FAB_USER_CHECK(type != "llama3" || s->high_freq_factor > s->low_freq_factor,
                 "{}: llama3 RoPE needs high_freq_factor > low_freq_factor", source);
  s->beta_fast = number(params, "beta_fast", 0, source);
  s->beta_slow = number(params, "beta_slow", 0, source);
  if (s->beta_fast == 0) s->beta_fast = 32;  // transformers: `get("beta_fast") or 32`
  if (s->beta_slow == 0) s->beta_slow = 1;
  if (params.contains("truncate") && params["truncate"].is_boolean()) s->truncate = params["truncate"].get<bool>();
  s->attention_factor = maybe_number(params, "attention_factor", source);
  s->mscale = maybe_number(params, "mscale", source);
  s->mscale_all_dim = maybe_number(params, "mscale_all_dim", source);
}

RopeFrequencies rope_frequencies(int64_t head_dim, double theta, const RopeScaling& s) {
  if (s.type == "yarn") return yarn(head_dim, theta, s);
  RopeFrequencies r{RopeTable::default_inv_freq(head_dim, theta), 1.0f};
  if (s.type == "linear")
    for (float& x : r.inv_freq) x = x / float(s.factor);
  if (s.type == "llama3") apply_llama3(r.inv_freq, s);
  // dynamic: transformers computes the frequencies at init for max_position_embeddings, where the
  // NTK base change is 1 (the default frequencies); DecoderModel refuses longer sequences.
  return r;
}

}  // namespace fab
