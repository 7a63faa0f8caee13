#include "infer/rollout.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <mutex>
#include <optional>

#include "core/error.h"
#include "core/profiler.h"
#include "core/rng.h"
#include "infer/kv_cache.h"
#include "nn/sequence_logps.h"

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
    FAB_USER_CHECK(!r.images.defined() || model.vision_tower(),
                   "generate: images given, but the model ({}) has no vision tower", model.config().model_type);
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

// What the engines of one rollout share: the requests (request i starts in slot i; then the next
// waiting one goes to the first slot freed), the cache, the outputs (each written by the engine
// that took its request) and a stop flag.
struct Shared {
  const std::vector<RolloutRequest>& requests;
  const SamplingOptions& o;
  SlotKvCache cache;
  std::vector<RolloutOutput> outputs;
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
};

// Continuous batching over a range of cache slots: every step feeds each busy slot's last token
// and the whole prompt of each newly filled slot through one forward, then samples one token per
// slot. A slot is freed as soon as its sequence ends and refilled at the next step. Each thread
// runs an engine of its own over its own slots, taking requests from one queue, so the threads
// never wait for each other until the queue is empty.
class Engine {
 public:
  Engine(DecoderModel& model, Shared& shared, size_t first_slot, size_t slots, const RolloutTokenCallback& on_token)
      : model_(model), shared_(shared), on_token_(on_token), first_slot_(first_slot), slots_(slots) {
    for (size_t s = 0; s < slots; ++s) start(s, first_slot + s);  // request i starts in slot i
  }

  void run(RolloutStats& stats) {
    while (!shared_.failed && fill_free_slots() > 0) step(stats);
  }

 private:
  // Gives waiting requests to free slots; returns how many slots are busy.
  size_t fill_free_slots() {
    size_t busy = 0;
    for (size_t s = 0; s < slots_.size(); ++s) {
      if (!slots_[s] && !drained_) {
        const size_t request = shared_.next.fetch_add(1);
        drained_ = request >= shared_.requests.size();
        if (!drained_) start(s, request);
      }
      busy += slots_[s].has_value();
    }
    return busy;
  }

  void start(size_t slot, size_t request) {
    slots_[slot] = Sequence{request, Rng(shared_.requests[request].seed), 0};
    shared_.cache.length[first_slot_ + slot] = 0;
  }

  void step(RolloutStats& stats) {
    std::vector<SlotSpan> spans;
    std::vector<int64_t> ids;
    for (size_t s = 0; s < slots_.size(); ++s) {
      if (!slots_[s]) continue;
      const int64_t slot = int64_t(first_slot_ + s);
      const bool fresh = shared_.cache.length[size_t(slot)] == 0;
      const RolloutRequest& request = shared_.requests[slots_[s]->request];
      if (fresh) {
        ids.insert(ids.end(), request.prompt.begin(), request.prompt.end());
        spans.push_back({slot, int64_t(request.prompt.size()), request.images});
      } else {
        ids.push_back(slots_[s]->pending);
        spans.push_back({slot, 1});
      }
    }
    Tensor id_tensor = Tensor::empty({int64_t(ids.size())}, DType::i64, MemoryCategory::activations);
    std::copy(ids.begin(), ids.end(), id_tensor.data<int64_t>());
    const Tensor logits = logits_slots(model_, id_tensor, spans, shared_.cache);
    const int64_t vocab = model_.config().vocab_size;
    std::vector<int32_t> sampled(spans.size());
    std::vector<double> logp(spans.size());
    const double temperature = shared_.o.temperature > 0 ? shared_.o.temperature : 1.0;
    ProfileScope profile("sample");
    // Each slot samples from its own stream: the same tokens whichever thread draws them.
#pragma omp parallel for schedule(dynamic)
    for (size_t i = 0; i < spans.size(); ++i) {
      const float* row = logits.data<float>() + int64_t(i) * vocab;
      sampled[i] = sample_token(row, vocab, shared_.o, slots_[size_t(spans[i].slot) - first_slot_]->rng);
      logp[i] = row_token_logp(row, vocab, sampled[i], temperature);
    }
    for (size_t i = 0; i < spans.size(); ++i) take(size_t(spans[i].slot) - first_slot_, sampled[i], logp[i]);
    stats.peak_batch = std::max(stats.peak_batch, int64_t(spans.size()));
    stats.generated_tokens += int64_t(spans.size());
  }

  // Appends `token` (and its log-probability) to the slot's output; ends the sequence on a stop id or at max_new_tokens.
  void take(size_t slot, int32_t token, double logp) {
    Sequence& seq = *slots_[slot];
    RolloutOutput& out = shared_.outputs[seq.request];
    out.tokens.push_back(token);
    out.logp.push_back(logp);
    if (on_token_) on_token_(seq.request, token);
    out.stopped = is_stop(shared_.o, token);
    seq.pending = token;
    if (out.stopped || int64_t(out.tokens.size()) == shared_.o.max_new_tokens) slots_[slot].reset();
  }

  DecoderModel& model_;
  Shared& shared_;
  const RolloutTokenCallback& on_token_;
  size_t first_slot_;
  std::vector<std::optional<Sequence>> slots_;
  bool drained_ = false;  // the queue is empty
};

bool has_images(const std::vector<RolloutRequest>& requests) {
  return std::any_of(requests.begin(), requests.end(), [](const RolloutRequest& r) { return r.images.defined(); });
}

// One engine per thread over its share of the slots when the model's slot steps may run at once
// (and there are slots for two threads at least); else one engine whose kernels use every thread.
// Prompts with images run one engine: the vision tower's GEMMs are the shared training ones.
void run_engines(DecoderModel& model, Shared& shared, const RolloutTokenCallback& on_token, RolloutStats& stats) {
  const int64_t slots = shared.cache.slots;
  const bool concurrent = model.decode_concurrent() && !has_images(shared.requests);
  const int threads = concurrent ? int(std::min<int64_t>(omp_get_max_threads(), slots)) : 1;
  std::vector<RolloutStats> per_thread(static_cast<size_t>(threads));
  if (threads == 1) {
    Engine(model, shared, 0, size_t(slots), on_token).run(per_thread[0]);
  } else {
    std::mutex callback_mutex;  // on_token sees one token at a time
    const RolloutTokenCallback serialized = on_token ? RolloutTokenCallback([&](size_t request, int32_t token) {
      std::lock_guard lock(callback_mutex);
      on_token(request, token);
    })
                                                     : RolloutTokenCallback();
    std::exception_ptr error;
#pragma omp parallel num_threads(threads)
    {
      const int t = omp_get_thread_num();
      const int64_t first = slots * t / threads, end = slots * (t + 1) / threads;
      try {
        Engine(model, shared, size_t(first), size_t(end - first), serialized).run(per_thread[size_t(t)]);
      } catch (...) {
        shared.failed = true;
#pragma omp critical(rollout_error)
        if (!error) error = std::current_exception();
      }
    }
    if (error) std::rethrow_exception(error);
  }
  for (const RolloutStats& s : per_thread) {
    stats.generated_tokens += s.generated_tokens;
    stats.peak_batch += s.peak_batch;
  }
}

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
  const int64_t slots = std::min<int64_t>(max_batch, int64_t(requests.size()));
  Shared shared{requests, options, make_slot_cache(model, slots, slot_capacity(requests, options)),
                std::vector<RolloutOutput>(requests.size())};
  shared.next = size_t(slots);
  RolloutStats run_stats;
  run_engines(model, shared, on_token, run_stats);
  if (stats) {
    stats->generated_tokens += run_stats.generated_tokens;
    stats->peak_batch = std::max(stats->peak_batch, run_stats.peak_batch);
    stats->seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  return std::move(shared.outputs);
}

}  // namespace fab
