#include "infer/generate.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "core/rng.h"

namespace fab {

// HF's order: temperature, then top-k, then top-p (keep the smallest set of most likely tokens
// whose probability reaches top_p, at least one), then sample from the renormalised rest.
int32_t sample_token(const float* logits, int64_t vocab, const SamplingOptions& o, Rng& rng) {
  if (o.temperature <= 0.0)
    return int32_t(std::max_element(logits, logits + vocab) - logits);
  std::vector<int32_t> order(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  size_t keep = o.top_k > 0 ? std::min<size_t>(size_t(o.top_k), order.size()) : order.size();
  std::vector<double> p(keep);
  const double top = double(logits[order[0]]) / o.temperature;
  double sum = 0;
  for (size_t i = 0; i < keep; ++i) sum += p[i] = std::exp(double(logits[order[i]]) / o.temperature - top);
  if (o.top_p < 1.0) {
    double cumulative = 0;
    size_t n = 0;
    while (n < keep && cumulative < o.top_p * sum) cumulative += p[n++];
    keep = std::max<size_t>(1, n);
    sum = cumulative;
  }
  double u = rng.uniform() * sum;
  for (size_t i = 0; i < keep; ++i) {
    u -= p[i];
    if (u <= 0) return order[i];
  }
  return order[keep - 1];
}

std::vector<int32_t> generate(DecoderModel& model, const std::vector<int32_t>& prompt, const SamplingOptions& o,
                              const std::function<void(int32_t)>& on_token) {
  FAB_USER_CHECK(!prompt.empty(), "generate: the prompt is empty");
  const int64_t context = model.options().max_seq_len ? model.options().max_seq_len
                                                      : model.config().max_position_embeddings;
  FAB_USER_CHECK(o.max_new_tokens >= 1 && int64_t(prompt.size()) + o.max_new_tokens <= context,
                 "max_new_tokens {}: with the prompt's {} tokens, expected at most {} positions in all (the model's "
                 "max_position_embeddings)",
                 o.max_new_tokens, prompt.size(), context);
  const int64_t vocab = model.config().vocab_size;
  KvCache cache = model.make_cache(1, int64_t(prompt.size()) + o.max_new_tokens);
  Rng rng(o.seed);
  Tensor ids = Tensor::empty({1, int64_t(prompt.size())}, DType::i64, MemoryCategory::activations);
  for (size_t i = 0; i < prompt.size(); ++i) ids.data<int64_t>()[i] = prompt[i];
  Tensor logits = model.logits_cached(ids, cache);
  std::vector<int32_t> out;
  const float* last = logits.data<float>() + (int64_t(prompt.size()) - 1) * vocab;
  for (int64_t step = 0; step < o.max_new_tokens; ++step) {
    const int32_t next = sample_token(last, vocab, o, rng);
    out.push_back(next);
    if (on_token) on_token(next);
    if (std::find(o.stop_ids.begin(), o.stop_ids.end(), next) != o.stop_ids.end()) break;
    if (step + 1 == o.max_new_tokens) break;
    Tensor one = Tensor::empty({1, 1}, DType::i64, MemoryCategory::activations);
    one.data<int64_t>()[0] = next;
    logits = model.logits_cached(one, cache);
    last = logits.data<float>();
  }
  return out;
}

}  // namespace fab
