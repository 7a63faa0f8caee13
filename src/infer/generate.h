#pragma once
// Text generation with a KV cache: the prompt is run once, then one token at a time.
#include <cstdint>
#include <functional>
#include <vector>

#include "models/decoder.h"

namespace fab {

struct SamplingOptions {
  int64_t max_new_tokens = 128;
  double temperature = 0.0;  // 0: greedy (argmax), as HF's do_sample=False
  double top_p = 1.0;        // nucleus sampling, as HF's TopPLogitsWarper
  int64_t top_k = 0;         // 0: no top-k filter
  uint64_t seed = 0;
  std::vector<int32_t> stop_ids;  // generation ends after emitting one of these
};

// Returns the new tokens (not the prompt). `on_token` (optional) sees each one as it comes. A
// vision-language model's prompt may bring the images of its image tokens.
std::vector<int32_t> generate(DecoderModel& model, const std::vector<int32_t>& prompt, const SamplingOptions& options,
                              const std::function<void(int32_t)>& on_token = {}, const ImageInputs& images = {});

// Picks the next token from one row of logits under `options` (exposed for tests).
int32_t sample_token(const float* logits, int64_t vocab, const SamplingOptions& options, class Rng& rng);

}  // namespace fab
