// RMSNorm and rotary position embedding.
#include <omp.h>

#include <cmath>

#include "kernels/cpu/isa_kernels.h"
#include "kernels/cpu/scratch.h"
#include "kernels/cpu/vec_math.h"

namespace fab::cpu::FAB_ISA {

// Hugging Face order: xhat = x * rstd (fp32), then y = w * xhat.
void rmsnorm_forward(const float* x, const float* w, int64_t rows, int64_t c, float eps, float* y, float* rstd) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * c;
    float ss = 0;
#pragma omp simd reduction(+ : ss)
    for (int64_t j = 0; j < c; ++j) ss += xr[j] * xr[j];
    float s = 1.0f / std::sqrt(ss / float(c) + eps);
    rstd[r] = s;
    float* yr = y + r * c;
#pragma omp simd
    for (int64_t j = 0; j < c; ++j) yr[j] = w[j] * (xr[j] * s);
  }
}

// y_j = w_j xhat_j, xhat = x r, r = (mean(x^2) + eps)^-1/2, d r / d x_i = -r^3 x_i / c.
// With g = dy * w:  dx = r (g - xhat mean(g xhat));   dw += sum over rows of dy * xhat.
void rmsnorm_backward(const float* x, const float* w, const float* rstd, const float* dy, int64_t rows, int64_t c,
                      float* dx, float* dw) {
  int threads = omp_get_max_threads();
  ScratchBuffer dw_partial{size_t(threads) * size_t(c)};
#pragma omp parallel num_threads(threads)
  {
    int t = omp_get_thread_num();
    Range rr = split_range(rows, omp_get_num_threads(), t);
    float* dwp = dw_partial.data() + size_t(t) * size_t(c);
    for (int64_t r = rr.begin; r < rr.end; ++r) {
      const float* xr = x + r * c;
      const float* dyr = dy + r * c;
      float s = rstd[r];
      float dot = 0;
#pragma omp simd reduction(+ : dot)
      for (int64_t j = 0; j < c; ++j) dot += dyr[j] * w[j] * xr[j] * s;
      float mean = dot / float(c);
      float* dxr = dx + r * c;
#pragma omp simd
      for (int64_t j = 0; j < c; ++j) {
        float xhat = xr[j] * s;
        dxr[j] += s * (dyr[j] * w[j] - xhat * mean);
        dwp[j] += dyr[j] * xhat;
      }
    }
  }
  for (int t = 0; t < threads; ++t) {
    const float* dwp = dw_partial.data() + size_t(t) * size_t(c);
#pragma omp simd
    for (int64_t j = 0; j < c; ++j) dw[j] += dwp[j];
  }
}

// rotate_half layout, h = d/2, angle of pair (j, j+h) = pos * inv_freq[j]:
//   y[j]   = x[j] cos - x[j+h] sin
//   y[j+h] = x[j+h] cos + x[j] sin
void rope_forward(const float* x, float* y, const int64_t* positions, const float* cos, const float* sin,
                  int64_t rows, int64_t heads, int64_t d) {
  const int64_t h = d / 2;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* c = cos + positions[r] * h;
    const float* s = sin + positions[r] * h;
    for (int64_t hd = 0; hd < heads; ++hd) {
      const float* a = x + (r * heads + hd) * d;
      float* ya = y + (r * heads + hd) * d;
#pragma omp simd
      for (int64_t j = 0; j < h; ++j) {
        const float x1 = a[j], x2 = a[j + h];
        ya[j] = x1 * c[j] - x2 * s[j];
        ya[j + h] = x2 * c[j] + x1 * s[j];
      }
    }
  }
}

// The transpose of the rotation above:  dx[j] += dy[j] cos + dy[j+h] sin;  dx[j+h] += dy[j+h] cos - dy[j] sin
void rope_backward(const float* dy, float* dx, const int64_t* positions, const float* cos, const float* sin,
                   int64_t rows, int64_t heads, int64_t d) {
  const int64_t h = d / 2;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* c = cos + positions[r] * h;
    const float* s = sin + positions[r] * h;
    for (int64_t hd = 0; hd < heads; ++hd) {
      const float* g = dy + (r * heads + hd) * d;
      float* out = dx + (r * heads + hd) * d;
#pragma omp simd
      for (int64_t j = 0; j < h; ++j) {
        const float g1 = g[j], g2 = g[j + h];
        out[j] += g1 * c[j] + g2 * s[j];
        out[j + h] += g2 * c[j] - g1 * s[j];
      }
    }
  }
}

}  // namespace fab::cpu::FAB_ISA
