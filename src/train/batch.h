#pragma once
// Micro-batches cut from preprocessed token sequences.
#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "dataset/token_sequences.h"

namespace fab {

struct Batch {
  Tensor ids;     // (B, T) i64, T = longest sequence of the batch, right-padded with pad_id
  Tensor labels;  // (B, T) i64, -100 on padding
  // Packed data only (otherwise undefined): each token's position inside its sample (B, T) i64,
  // and with a document mask the index of its sample's first token (B, T) i32. The padding of a
  // row counts as one more sample.
  Tensor positions, doc_start;
  Tensor lengths;      // (B) i64: each row's real tokens (the rest is padding)
  int64_t tokens = 0;  // real (unpadded) tokens
};

// document_mask (neat_packing): fill doc_start so attention stays inside each packed sample.
Batch collate(const TokenSequences& data, const std::vector<int64_t>& indices, int32_t pad_id,
              bool document_mask = false);

}  // namespace fab
