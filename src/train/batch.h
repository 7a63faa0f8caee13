#pragma once
// Token sequences after preprocessing, and micro-batches cut from them.
#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace fab {

// Samples stored back to back (the layout of the memory-mapped shards): sample i is
// [offsets[i], offsets[i + 1]) of tokens and labels (-100 = no loss on that position).
struct TokenSequences {
  std::vector<int32_t> tokens;
  std::vector<int32_t> labels;
  std::vector<int64_t> offsets{0};

  int64_t size() const { return int64_t(offsets.size()) - 1; }
  int64_t length(int64_t i) const { return offsets[size_t(i) + 1] - offsets[size_t(i)]; }
  void add(const std::vector<int32_t>& ids, const std::vector<int32_t>& sample_labels);
};

struct Batch {
  Tensor ids;     // (B, T) i64, T = longest sample of the batch, right-padded with pad_id
  Tensor labels;  // (B, T) i64, -100 on padding
  int64_t tokens = 0;  // real (unpadded) tokens
};

Batch collate(const TokenSequences& data, const std::vector<int64_t>& indices, int32_t pad_id);

}  // namespace fab
