#include "infer/kv_cache.h"

#include <omp.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/profiler.h"
#include "models/mrope.h"
#include "nn/op_helpers.h"

namespace fab {
namespace {

std::vector<Tensor> cache_tensors(const DecoderModel& model, Shape shape, bool zeroed) {
  std::vector<Tensor> out;
  const Device device = model.options().device;
  for (int64_t i = 0; i < model.config().num_hidden_layers; ++i)
    out.push_back(zeroed ? Tensor::zeros(shape, DType::f32, MemoryCategory::activations, device)
                         : Tensor::empty(shape, DType::f32, MemoryCategory::activations, device));
  return out;
}

AttentionShape decode_shape(const ModelConfig& c, int64_t batch, int64_t seq) {
  return {batch, seq, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
          float(1.0 / std::sqrt(double(c.head_dim)))};
}

Var new_attention_output(const Var& q) {
  return make_var(Tensor::empty(q->value.shape(), DType::f32, MemoryCategory::activations, q->value.device()));
}

// B sequences of n new tokens each: their keys and values join the cache after its `length`
// tokens, and the queries attend to every position up to their own.
class CacheAttention final : public AttentionCore {
 public:
  CacheAttention(const ModelConfig& config, KvCache& cache, int64_t n) : config_(config), cache_(cache), n_(n) {}

  Var attend(Tape&, size_t layer, const Var& q, const Var& k, const Var& v) override {
    const KernelTable& kt = kernels_for(q->value);
    KvCache& c = cache_;
    const int64_t row = config_.num_key_value_heads * config_.head_dim;
    for (int64_t b = 0; b < c.batch; ++b) {
      const int64_t at = (b * c.capacity + c.length) * row;
      kt.copy_2d(k->value.data<float>() + b * n_ * row, row, c.k[layer].data<float>() + at, row, n_, row, false);
      kt.copy_2d(v->value.data<float>() + b * n_ * row, row, c.v[layer].data<float>() + at, row, n_, row, false);
    }
    Var out = new_attention_output(q);
    kt.attention_decode(q->value.data<float>(), c.k[layer].data<float>(), c.v[layer].data<float>(),
                        decode_shape(config_, c.batch, n_), c.length, c.capacity, out->value.data<float>());
    return out;
  }

 private:
  const ModelConfig& config_;
  KvCache& cache_;
  int64_t n_;
};

// The rows of several slots: each span's keys and values join its slot, and its queries attend to
// that slot's positions 0 .. length + count - 1 only.
class SlotAttention final : public AttentionCore {
 public:
  SlotAttention(const ModelConfig& config, SlotKvCache& cache, const std::vector<SlotSpan>& spans)
      : config_(config), cache_(cache), spans_(spans), first_row_(spans.size() + 1, 0) {
    for (size_t s = 0; s < spans.size(); ++s) first_row_[s + 1] = first_row_[s] + spans[s].count;
  }

  Var attend(Tape&, size_t layer, const Var& q, const Var& k, const Var& v) override {
    ProfileScope profile("slot attention");
    const KernelTable& kt = kernels_for(q->value);
    const int64_t kv_row = config_.num_key_value_heads * config_.head_dim;
    const int64_t q_row = config_.num_attention_heads * config_.head_dim, slot_size = cache_.capacity * kv_row;
    Var out = new_attention_output(q);
    float* kc = cache_.k[layer].data<float>();
    float* vc = cache_.v[layer].data<float>();
    // One slot per iteration when there are slots for every thread: the kernel's own threads stay
    // idle inside (nested), so a step of many one-token slots is one parallel region, not one per
    // slot. Fewer slots (one long prompt, say) keep the kernel's own split over heads and queries.
    // A device's kernels are launched from one thread.
    const bool by_slot = q->value.device().is_host() && int64_t(spans_.size()) >= omp_get_max_threads();
#pragma omp parallel for schedule(dynamic) if (by_slot)
    for (size_t s = 0; s < spans_.size(); ++s) {
      const SlotSpan& span = spans_[s];
      const int64_t past = cache_.length[size_t(span.slot)], r0 = first_row_[s];
      float* ks = kc + span.slot * slot_size;
      float* vs = vc + span.slot * slot_size;
      kt.copy_2d(k->value.data<float>() + r0 * kv_row, kv_row, ks + past * kv_row, kv_row, span.count, kv_row, false);
      kt.copy_2d(v->value.data<float>() + r0 * kv_row, kv_row, vs + past * kv_row, kv_row, span.count, kv_row, false);
      kt.attention_decode(q->value.data<float>() + r0 * q_row, ks, vs, decode_shape(config_, 1, span.count), past,
                          cache_.capacity, out->value.data<float>() + r0 * q_row);
    }
    return out;
  }

  int64_t last_row(size_t span) const { return first_row_[span + 1] - 1; }

 private:
  const ModelConfig& config_;
  SlotKvCache& cache_;
  const std::vector<SlotSpan>& spans_;
  std::vector<int64_t> first_row_;
};

// Each row's position: its slot's length plus its place among the slot's new tokens, shifted by
// the slot's position delta. Where a span brings a prompt with images, every row gets M-RoPE's
// three positions instead ((3, rows): the prompt's from its images, the others' the same on all
// three axes, which turns them as plain RoPE does), and that slot's delta is set.
Tensor slot_positions(const DecoderModel& model, const Tensor& ids, const std::vector<SlotSpan>& spans,
                      SlotKvCache& cache) {
  FAB_CHECK(ids.ndim() == 1 && ids.dtype() == DType::i64, "ids must be (rows) i64, got {}", shape_str(ids.shape()));
  const int64_t rows = ids.numel();
  const bool mrope =
      std::any_of(spans.begin(), spans.end(), [](const SlotSpan& s) { return s.images.defined(); });
  Tensor positions = Tensor::empty(mrope ? Shape{3, rows} : Shape{rows}, DType::i64, MemoryCategory::activations);
  int64_t* out = positions.data<int64_t>();
  std::vector<bool> seen(size_t(cache.slots), false);
  int64_t row = 0;
  for (const SlotSpan& span : spans) {
    FAB_CHECK(span.slot >= 0 && span.slot < cache.slots && !seen[size_t(span.slot)] && span.count >= 1,
              "span of {} tokens in slot {} of {} (one span per slot)", span.count, span.slot, cache.slots);
    seen[size_t(span.slot)] = true;
    int64_t& length = cache.length[size_t(span.slot)];
    int64_t& delta = cache.position_delta[size_t(span.slot)];
    FAB_USER_CHECK(length + span.count <= cache.capacity, "generation needs {} positions but the cache holds {}",
                   length + span.count, cache.capacity);
    FAB_CHECK(row + span.count <= rows, "spans cover more than the {} ids", rows);
    if (length == 0) delta = 0;
    if (span.images.defined()) {
      FAB_CHECK(length == 0, "images come with a slot's prompt");
      const std::vector<int64_t> three =
          mrope_positions(model.config(), ids.view(row, {1, span.count}), span.images.image_grid_thw);
      delta = *std::max_element(three.begin(), three.end()) + 1 - span.count;
      for (int64_t axis = 0; axis < 3; ++axis)
        std::copy_n(three.begin() + axis * span.count, span.count, out + axis * rows + row);
    } else {
      for (int64_t t = 0; t < span.count; ++t)
        for (int64_t axis = 0; axis < (mrope ? 3 : 1); ++axis) out[axis * rows + row + t] = length + delta + t;
    }
    row += span.count;
  }
  FAB_CHECK(row == rows, "spans cover {} of the {} ids", row, rows);
  for (int64_t r = 0; r < rows; ++r)  // the vocabulary, and each position against RoPE and sliding_window
    model.check_ids(ids.view(r, {1, 1}), out[r]);
  return positions;
}

// The images of the spans that bring them, at their rows of the step.
std::vector<PromptImages> prompt_images(const std::vector<SlotSpan>& spans) {
  std::vector<PromptImages> images;
  int64_t row = 0;
  for (const SlotSpan& span : spans) {
    if (span.images.defined()) images.push_back({row, span.count, span.images});
    row += span.count;
  }
  return images;
}

}  // namespace

KvCache make_kv_cache(const DecoderModel& model, int64_t batch, int64_t capacity) {
  const ModelConfig& c = model.config();
  KvCache cache;
  cache.batch = batch;
  cache.capacity = capacity;
  cache.k = cache_tensors(model, {batch, capacity, c.num_key_value_heads, c.head_dim}, true);
  cache.v = cache_tensors(model, {batch, capacity, c.num_key_value_heads, c.head_dim}, true);
  return cache;
}

Tensor logits_cached(DecoderModel& model, const Tensor& ids, KvCache& cache) {
  model.check_ids(ids, cache.length);
  const int64_t batch = ids.dim(0), n = ids.dim(1);
  FAB_CHECK(batch == cache.batch, "cache for {} sequences, ids for {}", cache.batch, batch);
  FAB_USER_CHECK(cache.length + n <= cache.capacity, "generation needs {} positions but the cache holds {}",
                 cache.length + n, cache.capacity);
  Tensor positions = Tensor::empty({batch * n}, DType::i64, MemoryCategory::activations);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t t = 0; t < n; ++t) positions.data<int64_t>()[b * n + t] = cache.length + t;
  const Var hidden = model.decode_layers(ids.reshape({batch * n}), positions,
                                         std::make_shared<CacheAttention>(model.config(), cache, n));
  cache.length += n;
  return model.decode_logits(hidden).reshape({batch, n, model.config().vocab_size});
}

SlotKvCache make_slot_cache(const DecoderModel& model, int64_t slots, int64_t capacity) {
  const ModelConfig& c = model.config();
  SlotKvCache cache;
  cache.slots = slots;
  cache.capacity = capacity;
  cache.length.assign(size_t(slots), 0);
  cache.position_delta.assign(size_t(slots), 0);
  cache.k = cache_tensors(model, {slots, capacity, c.num_key_value_heads, c.head_dim}, false);
  cache.v = cache_tensors(model, {slots, capacity, c.num_key_value_heads, c.head_dim}, false);
  return cache;
}

Tensor logits_slots(DecoderModel& model, const Tensor& ids, const std::vector<SlotSpan>& spans, SlotKvCache& cache) {
  ProfileScope profile("slot rows forward");
  const Tensor positions = slot_positions(model, ids, spans, cache);
  const auto attention = std::make_shared<SlotAttention>(model.config(), cache, spans);
  const Var hidden = model.decode_layers(ids, positions, attention, prompt_images(spans));
  const int64_t C = model.config().hidden_size;
  const Var last =
      make_var(Tensor::empty({int64_t(spans.size()), C}, DType::f32, MemoryCategory::activations, hidden->value.device()));
  const KernelTable& kt = kernels_for(hidden->value);
  for (size_t s = 0; s < spans.size(); ++s)  // each span's last row
    kt.copy_2d(hidden->value.data<float>() + attention->last_row(s) * C, C, last->value.data<float>() + int64_t(s) * C,
               C, 1, C, false);
  Tensor logits = model.decode_logits(last);
  for (const SlotSpan& span : spans) cache.length[size_t(span.slot)] += span.count;
  return logits;
}

}  // namespace fab
