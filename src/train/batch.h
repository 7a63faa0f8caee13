#pragma once
// Micro-batches cut from preprocessed token sequences.
#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "data/token_sequences.h"

namespace fab {

struct Batch {
  Tensor ids;     // (B, T) i64, T = longest sample of the batch, right-padded with pad_id
  Tensor labels;  // (B, T) i64, -100 on padding
  int64_t tokens = 0;  // real (unpadded) tokens
};

Batch collate(const TokenSequences& data, const std::vector<int64_t>& indices, int32_t pad_id);

}  // namespace fab
