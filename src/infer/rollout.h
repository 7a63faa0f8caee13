#pragma once
// Rollouts for reinforcement learning (and batched `fabrica generate`): many prompts, each sampled
// with its own seeded stream, so what a request produces never depends on which other requests
// share its batch or in which order they finish.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "infer/generate.h"

namespace fab {

struct RolloutRequest {
  std::vector<int32_t> prompt;
  uint64_t seed = 0;  // this request's own sampling stream (SamplingOptions::seed is not used)
  // A vision-language model's images for the prompt's image tokens (undefined: text only). The
  // tower runs once, when the prompt enters the cache.
  ImageInputs images{};
};

struct RolloutOutput {
  std::vector<int32_t> tokens;  // the response; ends with the stop id when one ended it
  bool stopped = false;         // ended by a stop id (false: cut at max_new_tokens)
  // log p of each token under softmax(logits / temperature) (temperature 1 when greedy), taken from
  // the logits it was sampled from (nn/sequence_logps.h row_token_logp).
  std::vector<double> logp;
};

struct RolloutStats {
  int64_t generated_tokens = 0;
  int64_t peak_batch = 0;  // the most sequences decoded together (with one engine per thread: the sum of
                           // each engine's most)
  double seconds = 0;
};

// Generates a response for every request under `options`, decoding up to `max_batch` sequences
// together. Outputs come back in the order of `requests`.
std::vector<RolloutOutput> rollout(DecoderModel& model, const std::vector<RolloutRequest>& requests,
                                   const SamplingOptions& options, int64_t max_batch, RolloutStats* stats = nullptr);

// Sees each token as it is sampled, with the index of its request.
using RolloutTokenCallback = std::function<void(size_t request, int32_t token)>;

// rollout() with `on_token` called for every token in the order they are sampled.
std::vector<RolloutOutput> rollout_streamed(DecoderModel& model, const std::vector<RolloutRequest>& requests,
                                            const SamplingOptions& options, int64_t max_batch,
                                            const RolloutTokenCallback& on_token, RolloutStats* stats = nullptr);

}  // namespace fab
