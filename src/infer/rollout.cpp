#include "infer/rollout.h"

#include <algorithm>
#include <chrono>

namespace fab {

// One sequence at a time through generate(): the reference behaviour a batched engine must match.
std::vector<RolloutOutput> rollout(DecoderModel& model, const std::vector<RolloutRequest>& requests,
                                   const SamplingOptions& options, int64_t max_batch, RolloutStats* stats) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<RolloutOutput> outputs;
  outputs.reserve(requests.size());
  for (const RolloutRequest& request : requests) {
    SamplingOptions o = options;
    o.seed = request.seed;
    RolloutOutput out;
    out.tokens = generate(model, request.prompt, o);
    out.stopped = !out.tokens.empty() &&
                  std::find(o.stop_ids.begin(), o.stop_ids.end(), out.tokens.back()) != o.stop_ids.end();
    if (stats) stats->generated_tokens += int64_t(out.tokens.size());
    outputs.push_back(std::move(out));
  }
  if (stats) {
    stats->peak_batch = std::max<int64_t>(stats->peak_batch, requests.empty() ? 0 : 1);
    stats->seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  return outputs;
}

}  // namespace fab
