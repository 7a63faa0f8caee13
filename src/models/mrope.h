#pragma once
// Qwen2-VL's multimodal RoPE (M-RoPE): each token has a temporal, a height and a width position
// (transformers' get_rope_index), and the rotary pairs are split between the three by
// mrope_section (pairs [0, s0) turn with the temporal position, the next s1 with the height, the
// last s2 with the width; the second half of the head repeats the split, rotate-half style).
#include <cstdint>
#include <vector>

#include "models/model_config.h"
#include "nn/ops.h"

namespace fab {

// (3, B * T) positions of ids (B, T) i64 with the images of image_grid_thw (images, 3) taken in
// order, row after row: text tokens count up from where the previous part ended (the largest
// position so far + 1); an image's (t, h / s, w / s) merged tokens sit at that start + (t, h, w)
// index. A row without images gets 0..T-1 on all three. A UserError when the image tokens do not
// match the images (count, or a run of image tokens shorter or longer than its image). Packed rows
// (`sample_positions` (B, T) i64 defined: each token's position inside its sample, 0 where a
// sample begins): every sample counts from 0 again, as it would alone.
std::vector<int64_t> mrope_positions(const ModelConfig& c, const Tensor& ids, const Tensor& grid_thw,
                                     const Tensor& sample_positions = {});

// The cos/sin of each token for its own three positions: (rows, head_dim / 2), pair j turned by
// the position of its section. Use with positions 0..rows-1.
RopeTable mrope_table(const ModelConfig& c, const std::vector<float>& inv_freq, float attention_scaling,
                      const std::vector<int64_t>& positions);

}  // namespace fab
