#include "kernels/cpu/vision_kernels.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "kernels/kernel_table.h"

namespace fab::vision_kernels {

void layernorm_forward(const float* x, const float* w, const float* b, int64_t rows, int64_t c, float eps, float* y,
                       float* mean, float* rstd) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * c;
    double sum = 0, squares = 0;
    for (int64_t j = 0; j < c; ++j) sum += xr[j];
    const double mu = sum / double(c);
    for (int64_t j = 0; j < c; ++j) squares += (xr[j] - mu) * (xr[j] - mu);
    const float inv = float(1.0 / std::sqrt(squares / double(c) + double(eps)));
    mean[r] = float(mu);
    rstd[r] = inv;
    for (int64_t j = 0; j < c; ++j) y[r * c + j] = (xr[j] - float(mu)) * inv * w[j] + (b ? b[j] : 0.0f);
  }
}

void layernorm_backward(const float* x, const float* w, const float* mean, const float* rstd, const float* dy,
                        int64_t rows, int64_t c, float* dx, float* dw, float* db) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < (dx ? rows : 0); ++r) {
    const float* xr = x + r * c;
    const float* g = dy + r * c;
    double mean_g = 0, mean_gx = 0;
    for (int64_t j = 0; j < c; ++j) {
      const double xhat = (xr[j] - mean[r]) * rstd[r];
      mean_g += g[j] * w[j];
      mean_gx += g[j] * w[j] * xhat;
    }
    mean_g /= double(c);
    mean_gx /= double(c);
    for (int64_t j = 0; j < c; ++j) {
      const double xhat = (xr[j] - mean[r]) * rstd[r];
      dx[r * c + j] += float(rstd[r] * (g[j] * w[j] - mean_g - xhat * mean_gx));
    }
  }
  if (!dw && !db) return;
#pragma omp parallel for schedule(static)
  for (int64_t j = 0; j < c; ++j) {
    double sw = 0, sb = 0;
    for (int64_t r = 0; r < rows; ++r) {
      sw += double(dy[r * c + j]) * (x[r * c + j] - mean[r]) * rstd[r];
      sb += dy[r * c + j];
    }
    if (dw) dw[j] += float(sw);
    if (db) db[j] += float(sb);
  }
}

namespace {
float sigmoid(float z) { return 1.0f / (1.0f + std::exp(-z)); }
constexpr float kQuick = 1.702f;
}  // namespace

void quick_gelu_forward(const float* x, float* y, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * sigmoid(kQuick * x[i]);
}

void quick_gelu_backward(const float* x, const float* dy, float* dx, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float s = sigmoid(kQuick * x[i]);
    dx[i] += dy[i] * (s + kQuick * x[i] * s * (1.0f - s));
  }
}

void gelu_forward(const float* x, float* y, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] = 0.5f * x[i] * (1.0f + std::erf(x[i] * float(std::numbers::sqrt2 / 2)));
}

void gelu_backward(const float* x, const float* dy, float* dx, int64_t n) {
  const float inv_sqrt_2pi = float(1.0 / std::sqrt(2.0 * std::numbers::pi));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float phi = 0.5f * (1.0f + std::erf(x[i] * float(std::numbers::sqrt2 / 2)));
    dx[i] += dy[i] * (phi + x[i] * std::exp(-0.5f * x[i] * x[i]) * inv_sqrt_2pi);
  }
}

namespace {

// C (m, n) (+)= op(A) op(B) in fp32 through the CPU table's GEMM (oneDNN, threaded inside).
void gemm(const float* a, bool trans_a, const float* b, bool trans_b, float* c, int64_t m, int64_t n, int64_t k,
          bool accumulate) {
  MatmulArgs args;
  args.a = a;
  args.b = b;
  args.c = c;
  args.m = m, args.n = n, args.k = k;
  args.trans_a = trans_a, args.trans_b = trans_b;
  args.accumulate = accumulate;
  cpu_kernels().matmul(args);
}

// Head h's d columns of rows [begin, begin + n) of x (rows, width), as a contiguous (n, d) block.
void head_block(const float* x, int64_t width, int64_t begin, int64_t n, int64_t h, int64_t d, float* out) {
  for (int64_t i = 0; i < n; ++i) std::copy_n(x + (begin + i) * width + h * d, d, out + i * d);
}

// x's block of head h += block (n, d).
void add_head_block(const float* block, int64_t width, int64_t begin, int64_t n, int64_t h, int64_t d, float* x) {
  for (int64_t i = 0; i < n; ++i)
    for (int64_t e = 0; e < d; ++e) x[(begin + i) * width + h * d + e] += block[i * d + e];
}

// One segment and head's blocks: q, k, v, out, dout (n, d) each, and the (n, n) scores.
struct HeadBlocks {
  std::vector<float> q, k, v, out, dout, scores;
  HeadBlocks(int64_t n, int64_t d)
      : q(size_t(n * d)), k(size_t(n * d)), v(size_t(n * d)), out(size_t(n * d)), dout(size_t(n * d)),
        scores(size_t(n * n)) {}
};

}  // namespace

// Per segment and head: S = scale Q K^T, P = softmax(S) by rows (lse kept), O = P V.
void segment_attention_forward(const float* q, const float* k, const float* v, const std::vector<int64_t>& bounds,
                               int64_t heads, int64_t d, float scale, float* out, float* lse) {
  const int64_t rows = bounds.back(), width = heads * d;
  for (size_t s = 0; s + 1 < bounds.size(); ++s) {
    const int64_t begin = bounds[s], n = bounds[s + 1] - begin;
    if (n == 0) continue;
    HeadBlocks b(n, d);
    for (int64_t h = 0; h < heads; ++h) {
      head_block(q, width, begin, n, h, d, b.q.data());
      head_block(k, width, begin, n, h, d, b.k.data());
      head_block(v, width, begin, n, h, d, b.v.data());
      gemm(b.q.data(), false, b.k.data(), true, b.scores.data(), n, n, d, false);
      // Each row: exp((s - max s) scale) vectorised (the sampler's kernel), then normalised.
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < n; ++i) {
        float* row = b.scores.data() + i * n;
        float top = row[0];
        for (int64_t j = 1; j < n; ++j) top = std::max(top, row[j]);
        const double sum = cpu_kernels().sampling_weights(row, n, scale, row);
        const float inverse = float(1.0 / sum);
        for (int64_t j = 0; j < n; ++j) row[j] *= inverse;
        lse[h * rows + begin + i] = float(double(top) * scale + std::log(sum));
      }
      gemm(b.scores.data(), false, b.v.data(), false, b.out.data(), n, d, n, false);
      for (int64_t i = 0; i < n; ++i) std::copy_n(b.out.data() + i * d, d, out + (begin + i) * width + h * d);
    }
  }
}

// Per segment and head, P = exp(scale Q K^T - lse) recomputed: dV += P^T dO; dP = dO V^T;
// dS = P * (dP - delta) with delta_i = dO_i . O_i; dQ += scale dS K; dK += scale dS^T Q.
void segment_attention_backward(const float* q, const float* k, const float* v, const float* out, const float* lse,
                                const float* dout, const std::vector<int64_t>& bounds, int64_t heads, int64_t d,
                                float scale, float* dq, float* dk, float* dv) {
  const int64_t rows = bounds.back(), width = heads * d;
  for (size_t s = 0; s + 1 < bounds.size(); ++s) {
    const int64_t begin = bounds[s], n = bounds[s + 1] - begin;
    if (n == 0) continue;
    HeadBlocks b(n, d);
    std::vector<float> dp(size_t(n * n)), grad(size_t(n * d));
    for (int64_t h = 0; h < heads; ++h) {
      head_block(q, width, begin, n, h, d, b.q.data());
      head_block(k, width, begin, n, h, d, b.k.data());
      head_block(v, width, begin, n, h, d, b.v.data());
      head_block(out, width, begin, n, h, d, b.out.data());
      head_block(dout, width, begin, n, h, d, b.dout.data());
      gemm(b.q.data(), false, b.k.data(), true, b.scores.data(), n, n, d, false);
      gemm(b.dout.data(), false, b.v.data(), true, dp.data(), n, n, d, false);
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < n; ++i) {
        float* p = b.scores.data() + i * n;
        float* ds = dp.data() + i * n;
        const float row_lse = lse[h * rows + begin + i];
        double delta = 0;
        for (int64_t e = 0; e < d; ++e) delta += double(b.dout[size_t(i * d + e)]) * b.out[size_t(i * d + e)];
        for (int64_t j = 0; j < n; ++j) {
          p[j] = std::exp(p[j] * scale - row_lse);
          ds[j] = p[j] * (ds[j] - float(delta)) * scale;
        }
      }
      gemm(b.scores.data(), true, b.dout.data(), false, grad.data(), n, d, n, false);  // dV = P^T dO
      add_head_block(grad.data(), width, begin, n, h, d, dv);
      gemm(dp.data(), false, b.k.data(), false, grad.data(), n, d, n, false);  // dQ = dS K
      add_head_block(grad.data(), width, begin, n, h, d, dq);
      gemm(dp.data(), true, b.q.data(), false, grad.data(), n, d, n, false);  // dK = dS^T Q
      add_head_block(grad.data(), width, begin, n, h, d, dk);
    }
  }
}

}  // namespace fab::vision_kernels
