#include "train/batch.h"

#include <algorithm>

#include "core/error.h"

namespace fab {
namespace {

// Row r of positions / doc_start for a packed sequence of n tokens padded to T: samples start at
// `starts` (then the padding at n).
void fill_layout(std::vector<int64_t> starts, int64_t n, int64_t T, int64_t* positions, int32_t* doc_start) {
  if (n < T) starts.push_back(n);
  for (size_t k = 0; k < starts.size(); ++k) {
    const int64_t begin = starts[k], end = k + 1 < starts.size() ? starts[k + 1] : T;
    for (int64_t t = begin; t < end; ++t) {
      positions[t] = t - begin;
      if (doc_start) doc_start[t] = int32_t(begin);
    }
  }
}

}  // namespace

namespace {

// The images of the chosen sequences, concatenated in row order.
void attach_images(Batch& batch, const std::vector<SequenceImages>& images, const std::vector<int64_t>& indices) {
  int64_t patches = 0, count = 0, values = 0;
  for (int64_t i : indices) {
    const SequenceImages& s = images[size_t(i)];
    if (!s.pixel_values.defined()) continue;
    FAB_CHECK(s.pixel_values.ndim() == 2 && s.grid_thw.ndim() == 2 && s.grid_thw.dim(1) == 3,
              "sequence {}: pixel_values (patches, values) and grid_thw (images, 3)", i);
    FAB_CHECK(values == 0 || values == s.pixel_values.dim(1), "sequence {}: {} values per patch, not {}", i,
              s.pixel_values.dim(1), values);
    values = s.pixel_values.dim(1);
    patches += s.pixel_values.dim(0);
    count += s.grid_thw.dim(0);
  }
  if (count == 0) return;
  batch.pixel_values = Tensor::empty({patches, values}, DType::f32, MemoryCategory::activations);
  batch.image_grid_thw = Tensor::empty({count, 3}, DType::i64, MemoryCategory::activations);
  float* pixels = batch.pixel_values.data<float>();
  int64_t* grid = batch.image_grid_thw.data<int64_t>();
  for (int64_t i : indices) {
    const SequenceImages& s = images[size_t(i)];
    if (!s.pixel_values.defined()) continue;
    pixels = std::copy_n(s.pixel_values.data<float>(), s.pixel_values.numel(), pixels);
    grid = std::copy_n(s.grid_thw.data<int64_t>(), s.grid_thw.numel(), grid);
  }
}

}  // namespace

Batch collate(const TokenSequences& data, const std::vector<int64_t>& indices, int32_t pad_id, bool document_mask,
              const std::vector<SequenceImages>& images) {
  int64_t longest = 0;
  for (int64_t i : indices) longest = std::max(longest, data.length(i));
  const int64_t b = int64_t(indices.size());
  Batch batch;
  batch.ids = Tensor::empty({b, longest}, DType::i64, MemoryCategory::activations);
  batch.labels = Tensor::empty({b, longest}, DType::i64, MemoryCategory::activations);
  batch.lengths = Tensor::empty({b}, DType::i64, MemoryCategory::activations);
  if (data.packed()) {
    batch.positions = Tensor::empty({b, longest}, DType::i64, MemoryCategory::activations);
    if (document_mask) batch.doc_start = Tensor::empty({b, longest}, DType::i32, MemoryCategory::activations);
  }
  int64_t* ids = batch.ids.data<int64_t>();
  int64_t* labels = batch.labels.data<int64_t>();
  for (int64_t r = 0; r < b; ++r) {
    const int64_t start = data.offsets[size_t(indices[size_t(r)])], n = data.length(indices[size_t(r)]);
    for (int64_t t = 0; t < longest; ++t) {
      ids[r * longest + t] = t < n ? data.tokens[size_t(start + t)] : pad_id;
      labels[r * longest + t] = t < n ? data.labels[size_t(start + t)] : -100;
    }
    if (data.packed())
      fill_layout(data.sample_starts(indices[size_t(r)]), n, longest, batch.positions.data<int64_t>() + r * longest,
                  document_mask ? batch.doc_start.data<int32_t>() + r * longest : nullptr);
    batch.lengths.data<int64_t>()[r] = n;
    batch.tokens += n;
  }
  if (images.empty()) return batch;
  FAB_CHECK(int64_t(images.size()) == data.size(), "{} image entries for {} sequences", images.size(), data.size());
  attach_images(batch, images, indices);
  return batch;
}

SequenceLayout image_layout(const Batch& batch) {
  SequenceLayout layout;
  layout.pixel_values = batch.pixel_values;
  layout.image_grid_thw = batch.image_grid_thw;
  return layout;
}

}  // namespace fab
