#include "infer/rollout.h"

#include <algorithm>
#include <chrono>
#include <optional>

#include "core/error.h"
#include "core/profiler.h"
#include "core/rng.h"

namespace fab {
namespace {

// A request being decoded: its own sampling stream, its output so far, and the token it sampled
// last, which the next step feeds in.
struct Sequence {
  size_t request = 0;
  Rng rng;
  int32_t pending = 0;
};

bool is_stop(const SamplingOptions& o, int32_t token) {
  return std::find(o.stop_ids.begin(), o.stop_ids.end(), token) != o.stop_ids.end();
}

void check_requests(const DecoderModel& model, const std::vector<RolloutRequest>& requests,
                    const SamplingOptions& o, int64_t max_batch) {
  FAB_USER_CHECK(max_batch >= 1, "rollout: max_batch {}, expected at least 1", max_batch);
  const int64_t context = model.options().max_seq_len ? model.options().max_seq_len
                                                      : model.config().max_position_embeddings;
  for (const RolloutRequest& r : requests) {
    FAB_USER_CHECK(!r.prompt.empty(), "generate: the prompt is empty");
    FAB_USER_CHECK(o.max_new_tokens >= 1 && int64_t(r.prompt.size()) + o.max_new_tokens <= context,
                   "max_new_tokens {}: with the prompt's {} tokens, expected at most {} positions in all (the "
                   "model's max_position_embeddings)",
                   o.max_new_tokens, r.prompt.size(), context);
  }
}

// The positions the longest request can need: what each slot of the cache holds.
int64_t slot_capacity(const std::vector<RolloutRequest>& requests, const SamplingOptions& o) {
  size_t longest = 0;
  for (const RolloutRequest& r : requests) longest = std::max(longest, r.prompt.size());
  return int64_t(longest) + o.max_new_tokens;
}

// Continuous batching over a fixed set of cache slots: every step feeds each busy slot's last
// token and the whole prompt of each newly filled slot through one forward, then samples one
// token per slot. A slot is freed as soon as its sequence ends and refilled at the next step.
class Engine {
 public:
  Engine(DecoderModel& model, const std::vector<RolloutRequest>& requests, const SamplingOptions& o,
         int64_t max_batch, const RolloutTokenCallback& on_token)
      : model_(model), requests_(requests), o_(o), on_token_(on_token),
        slots_(size_t(std::min<int64_t>(max_batch, int64_t(requests.size())))),
        cache_(model.make_slot_cache(int64_t(slots_.size()), slot_capacity(requests, o))),
        outputs_(requests.size()) {}

  std::vector<RolloutOutput> run(RolloutStats* stats) {
    while (fill_free_slots() > 0) step(stats);
    return std::move(outputs_);
  }

 private:
  // Gives waiting requests to free slots; returns how many slots are busy.
  size_t fill_free_slots() {
    size_t busy = 0;
    for (size_t s = 0; s < slots_.size(); ++s) {
      if (!slots_[s] && next_ < requests_.size()) {
        slots_[s] = Sequence{next_, Rng(requests_[next_].seed), 0};
        cache_.length[s] = 0;
        ++next_;
      }
      busy += slots_[s].has_value();
    }
    return busy;
  }

  void step(RolloutStats* stats) {
    std::vector<SlotSpan> spans;
    std::vector<int64_t> ids;
    for (size_t s = 0; s < slots_.size(); ++s) {
      if (!slots_[s]) continue;
      const bool fresh = cache_.length[s] == 0;
      const std::vector<int32_t>& prompt = requests_[slots_[s]->request].prompt;
      if (fresh) ids.insert(ids.end(), prompt.begin(), prompt.end());
      else ids.push_back(slots_[s]->pending);
      spans.push_back({int64_t(s), fresh ? int64_t(prompt.size()) : 1});
    }
    Tensor id_tensor = Tensor::empty({int64_t(ids.size())}, DType::i64, MemoryCategory::activations);
    std::copy(ids.begin(), ids.end(), id_tensor.data<int64_t>());
    const Tensor logits = model_.logits_slots(id_tensor, spans, cache_);
    const int64_t vocab = model_.config().vocab_size;
    std::vector<int32_t> sampled(spans.size());
    ProfileScope profile("sample");
    // Each slot samples from its own stream: the same tokens whichever thread draws them.
#pragma omp parallel for schedule(dynamic)
    for (size_t i = 0; i < spans.size(); ++i)
      sampled[i] = sample_token(logits.data<float>() + int64_t(i) * vocab, vocab, o_,
                                slots_[size_t(spans[i].slot)]->rng);
    for (size_t i = 0; i < spans.size(); ++i) take(size_t(spans[i].slot), sampled[i]);
    if (stats) {
      stats->peak_batch = std::max(stats->peak_batch, int64_t(spans.size()));
      stats->generated_tokens += int64_t(spans.size());
    }
  }

  // Appends `token` to the slot's output; ends the sequence on a stop id or at max_new_tokens.
  void take(size_t slot, int32_t token) {
    Sequence& seq = *slots_[slot];
    RolloutOutput& out = outputs_[seq.request];
    out.tokens.push_back(token);
    if (on_token_) on_token_(seq.request, token);
    out.stopped = is_stop(o_, token);
    seq.pending = token;
    if (out.stopped || int64_t(out.tokens.size()) == o_.max_new_tokens) slots_[slot].reset();
  }

  DecoderModel& model_;
  const std::vector<RolloutRequest>& requests_;
  const SamplingOptions& o_;
  const RolloutTokenCallback& on_token_;
  std::vector<std::optional<Sequence>> slots_;
  SlotKvCache cache_;
  std::vector<RolloutOutput> outputs_;
  size_t next_ = 0;  // the first request not yet given a slot
};

}  // namespace

std::vector<RolloutOutput> rollout(DecoderModel& model, const std::vector<RolloutRequest>& requests,
                                   const SamplingOptions& options, int64_t max_batch, RolloutStats* stats) {
  return rollout_streamed(model, requests, options, max_batch, {}, stats);
}

std::vector<RolloutOutput> rollout_streamed(DecoderModel& model, const std::vector<RolloutRequest>& requests,
                                            const SamplingOptions& options, int64_t max_batch,
                                            const RolloutTokenCallback& on_token, RolloutStats* stats) {
  check_requests(model, requests, options, max_batch);
  if (requests.empty()) return {};
  const auto start = std::chrono::steady_clock::now();
  std::vector<RolloutOutput> outputs = Engine(model, requests, options, max_batch, on_token).run(stats);
  if (stats) stats->seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return outputs;
}

}  // namespace fab
