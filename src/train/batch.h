#pragma once
// Micro-batches cut from preprocessed token sequences.
#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "dataset/token_sequences.h"
#include "models/decoder.h"

namespace fab {

// One sequence's images as the image processor emits them (docs/architecture/vision.md):
// pixel_values (patches, channels * temporal_patch_size * patch_size^2) f32 and grid_thw
// (images, 3) i64, the images in the order of their image tokens. Undefined: no images.
struct SequenceImages {
  Tensor pixel_values, grid_thw;
};

struct Batch {
  Tensor ids;     // (B, T) i64, T = longest sequence of the batch, right-padded with pad_id
  Tensor labels;  // (B, T) i64, -100 on padding
  // Packed data only (otherwise undefined): each token's position inside its sample (B, T) i64,
  // and with a document mask the index of its sample's first token (B, T) i32. The padding of a
  // row counts as one more sample.
  Tensor positions, doc_start;
  // A vision-language model's images: every row's, row after row (undefined without images).
  Tensor pixel_values, image_grid_thw;
  Tensor lengths;      // (B) i64: each row's real tokens (the rest is padding)
  int64_t tokens = 0;  // real (unpadded) tokens
};

// document_mask (neat_packing): fill doc_start so attention stays inside each packed sample.
// images: empty (text only) or one entry per sequence of `data`, whose images the batch carries.
Batch collate(const TokenSequences& data, const std::vector<int64_t>& indices, int32_t pad_id,
              bool document_mask = false, const std::vector<SequenceImages>& images = {});

// A forward's layout carrying `batch`'s images and nothing else (the stages that read no packing
// layout: preference, rollouts, the critic).
SequenceLayout image_layout(const Batch& batch);

}  // namespace fab
