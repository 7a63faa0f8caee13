#pragma once
// The differentiable ops the vision tower (models/vision_tower.h) adds to nn/ops.h, on the CPU
// (kernels/cpu/vision_kernels.h): LayerNorm with a bias, QuickGELU, GELU, bidirectional attention
// inside segments of rows, and the scatter of image features into the token embeddings.
#include <cstdint>
#include <functional>
#include <vector>

#include "nn/ops.h"

namespace fab {

// A RoPE table of given angles: (rows, half) cos and sin of angle(row, pair), times
// attention_scaling, for rotate-half RoPE over heads of 2 * half features. A pass's own table
// (M-RoPE's, the tower's 2-D rotary) is used with positions 0..rows-1.
RopeTable rope_table_of(int64_t rows, int64_t half, float attention_scaling, MemoryCategory category,
                        const std::function<float(int64_t row, int64_t pair)>& angle);
// Row-wise LayerNorm over the last dimension; bias may be null.
Var layernorm(Tape& tape, const Var& x, const Var& weight, const Var& bias, float eps);
Var quick_gelu(Tape& tape, const Var& x);
Var gelu(Tape& tape, const Var& x);
// q, k, v (rows, heads * d): row i attends to every row of its segment [bounds[s], bounds[s + 1])
// (Hugging Face's cu_seqlens), not causally. scale multiplies q k^T.
Var segment_attention(Tape& tape, const Var& q, const Var& k, const Var& v, const std::vector<int64_t>& bounds,
                      int64_t heads, float scale);
// The same values in another shape (a view); the gradient flows back unchanged.
Var reshape(Tape& tape, const Var& x, Shape shape);
// out = base with out[rows[j]] = src[j] (rows (n) i64 distinct, on the host):
//   d base = d out with rows[] zeroed;  d src[j] = d out[rows[j]].
Var scatter_rows(Tape& tape, const Var& base, const std::vector<int64_t>& rows, const Var& src);

}  // namespace fab
