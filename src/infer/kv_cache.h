#pragma once
// Generation's KV caches and the model's decode passes over them. The layers are the model's own
// (DecoderLayer::forward, models/decoder_layer.h); a cache only supplies the attention core that
// stores each new token's keys and values and attends over everything the cache holds.
#include <cstdint>
#include <vector>

#include "models/decoder.h"

namespace fab {

// Keys and values of every layer for `batch` sequences generated in step: (B, capacity, KVH, D)
// each, filled up to `length`.
struct KvCache {
  std::vector<Tensor> k, v;
  int64_t batch = 0, capacity = 0, length = 0;
};

KvCache make_kv_cache(const DecoderModel& model, int64_t batch, int64_t capacity);
// The logits (B, n, vocab), on the host, of the positions of `ids` (B, n) i64, which follow the
// cache's contents and join them.
Tensor logits_cached(DecoderModel& model, const Tensor& ids, KvCache& cache);

// Continuous batching (infer/rollout.cpp): `slots` sequences side by side in one cache, each with
// its own length, so sequences of different ages share a step. (slots, capacity, KVH, D) each.
struct SlotKvCache {
  std::vector<Tensor> k, v;
  int64_t slots = 0, capacity = 0;
  std::vector<int64_t> length;  // the tokens each slot holds
  // What each slot's next position is ahead of its length: 0, or for a prompt with images the
  // largest M-RoPE position + 1 - its tokens (transformers' rope_deltas, negative: an image's
  // tokens take fewer positions than tokens), set by the step that brings the slot's prompt.
  std::vector<int64_t> position_delta;
};

// The new tokens of one slot in a batched step: `count` consecutive rows of the step's ids. A
// vision-language model's prompt (the slot empty) may bring its images, as the processor emits
// them; the tower runs on them and M-RoPE places the prompt's tokens.
struct SlotSpan {
  int64_t slot = 0, count = 0;
  ImageInputs images{};  // undefined: text only
};

SlotKvCache make_slot_cache(const DecoderModel& model, int64_t slots, int64_t capacity);
// One forward over the new tokens of several slots, `ids` (sum of counts) i64 in the order of
// `spans` (one span per slot at most). A slot's tokens take its positions length .. length +
// count - 1 and attend to that slot's cache only. Returns (spans, vocab) on the host: the logits
// of each span's last token (the head runs on those rows only). Threads may run it at once over
// disjoint slots of one cache where model.decode_concurrent().
Tensor logits_slots(DecoderModel& model, const Tensor& ids, const std::vector<SlotSpan>& spans, SlotKvCache& cache);

}  // namespace fab
