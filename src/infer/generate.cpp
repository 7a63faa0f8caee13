#include "infer/generate.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "core/rng.h"
#include "infer/rollout.h"
#include "core/backend.h"

namespace fab {

namespace {

// Draws token t with probability weight[t] / sum(weight).
int32_t draw(const std::vector<float>& weight, double sum, Rng& rng) {
  double u = rng.uniform() * sum;
  for (size_t t = 0; t < weight.size(); ++t) {
    u -= weight[t];
    if (u <= 0) return int32_t(t);
  }
  return int32_t(weight.size() - 1);
}

// Draws order[i] with probability weight[order[i]] / sum over the first `n` of order.
int32_t draw(const std::vector<float>& weight, const int32_t* order, size_t n, double sum, Rng& rng) {
  double u = rng.uniform() * sum;
  for (size_t i = 0; i < n; ++i) {
    u -= weight[size_t(order[i])];
    if (u <= 0) return order[i];
  }
  return order[n - 1];
}

}  // namespace

// HF's order: temperature, then top-k, then top-p (keep the smallest set of most likely tokens
// whose probability reaches top_p, at least one), then sample from the renormalised rest. Only
// the kept tokens are sorted (most likely first, ties by id): without top-k or top-p nothing is,
// and top-p alone sorts a prefix that doubles until it holds the nucleus.
int32_t sample_token(const float* logits, int64_t vocab, const SamplingOptions& o, Rng& rng) {
  if (o.temperature <= 0.0)
    return int32_t(std::max_element(logits, logits + vocab) - logits);
  // exp((logit - max) / temperature) in fp32, vectorised; the sums are in double.
  std::vector<float> weight(static_cast<size_t>(vocab));
  const double total = backend(DeviceKind::cpu).kernels().sampling_weights(logits, vocab, float(1.0 / o.temperature), weight.data());
  const bool top_k = o.top_k > 0 && o.top_k < vocab;
  if (!top_k && o.top_p >= 1.0) return draw(weight, total, rng);
  std::vector<int32_t> order(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  auto more_likely = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  size_t keep = top_k ? size_t(o.top_k) : order.size();
  if (top_k) {
    std::nth_element(order.begin(), order.begin() + ptrdiff_t(keep) - 1, order.end(), more_likely);
    std::sort(order.begin(), order.begin() + ptrdiff_t(keep), more_likely);
  }
  double sum = 0;
  for (size_t i = 0; i < keep; ++i) sum += weight[size_t(order[i])];
  if (o.top_p >= 1.0) return draw(weight, order.data(), keep, sum, rng);
  for (size_t sorted = top_k ? keep : std::min<size_t>(64, keep);; sorted = std::min(keep, 2 * sorted)) {
    if (!top_k) std::partial_sort(order.begin(), order.begin() + ptrdiff_t(sorted), order.end(), more_likely);
    double cumulative = 0;
    size_t n = 0;
    while (n < sorted && cumulative < o.top_p * sum) cumulative += weight[size_t(order[n++])];
    if (cumulative >= o.top_p * sum || sorted == keep)
      return draw(weight, order.data(), std::max<size_t>(1, n), cumulative, rng);
  }
}

// One request through the rollout engine (batch 1), seeded with options.seed.
std::vector<int32_t> generate(DecoderModel& model, const std::vector<int32_t>& prompt, const SamplingOptions& o,
                              const std::function<void(int32_t)>& on_token, const ImageInputs& images) {
  const RolloutTokenCallback each = on_token ? [&](size_t, int32_t token) { on_token(token); } : RolloutTokenCallback();
  return rollout_streamed(model, {{prompt, o.seed, images}}, o, 1, each).front().tokens;
}

}  // namespace fab
