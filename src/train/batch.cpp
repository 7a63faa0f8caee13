#include "train/batch.h"

#include <algorithm>

#include "core/error.h"

namespace fab {

Batch collate(const TokenSequences& data, const std::vector<int64_t>& indices, int32_t pad_id) {
  int64_t longest = 0;
  for (int64_t i : indices) longest = std::max(longest, data.length(i));
  const int64_t b = int64_t(indices.size());
  Batch batch;
  batch.ids = Tensor::empty({b, longest}, DType::i64, MemoryCategory::activations);
  batch.labels = Tensor::empty({b, longest}, DType::i64, MemoryCategory::activations);
  int64_t* ids = batch.ids.data<int64_t>();
  int64_t* labels = batch.labels.data<int64_t>();
  for (int64_t r = 0; r < b; ++r) {
    const int64_t start = data.offsets[size_t(indices[size_t(r)])], n = data.length(indices[size_t(r)]);
    for (int64_t t = 0; t < longest; ++t) {
      ids[r * longest + t] = t < n ? data.tokens[size_t(start + t)] : pad_id;
      labels[r * longest + t] = t < n ? data.labels[size_t(start + t)] : -100;
    }
    batch.tokens += n;
  }
  return batch;
}

}  // namespace fab
