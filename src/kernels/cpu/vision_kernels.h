#pragma once
// The vision tower's CPU kernels (models/vision_tower.h): LayerNorm with a bias, QuickGELU and
// erf-GELU, and bidirectional attention kept inside segments of rows (one image or one window
// each, Hugging Face's cu_seqlens). Plain functions over host memory, outside the KernelTable
// (the attention's GEMMs are the CPU table's matmul): the tower runs on the CPU only
// (DecoderModel refuses a vision model on another device).
// Backward kernels accumulate (+=) into every gradient they write, as the KernelTable's do.
#include <cstdint>
#include <vector>

namespace fab::vision_kernels {

// y = (x - mean) * rstd * w + b per row of c features, rstd = 1 / sqrt(var + eps) (biased var).
void layernorm_forward(const float* x, const float* w, const float* b, int64_t rows, int64_t c, float eps, float* y,
                       float* mean, float* rstd);
// xhat = (x - mean) * rstd, g = dy * w:
//   dx += rstd * (g - mean(g) - xhat * mean(g * xhat));  dw += sum_rows dy * xhat;  db += sum_rows dy.
// dx, dw, db may each be null (an input without a gradient, a frozen norm).
void layernorm_backward(const float* x, const float* w, const float* mean, const float* rstd, const float* dy,
                        int64_t rows, int64_t c, float* dx, float* dw, float* db);

// QuickGELU: y = x * sigmoid(1.702 x);  dy/dx = s + 1.702 x s (1 - s), s = sigmoid(1.702 x).
void quick_gelu_forward(const float* x, float* y, int64_t n);
void quick_gelu_backward(const float* x, const float* dy, float* dx, int64_t n);
// GELU (erf): y = x Phi(x) = x (1 + erf(x / sqrt 2)) / 2;  dy/dx = Phi(x) + x exp(-x^2 / 2) / sqrt(2 pi).
void gelu_forward(const float* x, float* y, int64_t n);
void gelu_backward(const float* x, const float* dy, float* dx, int64_t n);

// Attention of q, k, v (rows, heads * d) where row i attends to every row of its segment
// [bounds[s], bounds[s + 1]) (bounds ascending, bounds.front() 0, bounds.back() rows): out
// (rows, heads * d) and the log-sum-exp of each row's scores, lse (heads, rows).
void segment_attention_forward(const float* q, const float* k, const float* v, const std::vector<int64_t>& bounds,
                               int64_t heads, int64_t d, float scale, float* out, float* lse);
// With P = exp(scale q k^T - lse) per segment and head, delta_i = sum_e dout_ie out_ie:
//   dv += P^T dout;  dS = P * (dout v^T - delta);  dq += scale dS k;  dk += scale dS^T q.
void segment_attention_backward(const float* q, const float* k, const float* v, const float* out, const float* lse,
                                const float* dout, const std::vector<int64_t>& bounds, int64_t heads, int64_t d,
                                float scale, float* dq, float* dk, float* dv);

}  // namespace fab::vision_kernels
