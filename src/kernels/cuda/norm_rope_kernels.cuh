#pragma once
// The RMSNorm and RoPE kernels of norm_rope.cu, device code only (see elementwise_kernels.cuh for
// why they sit in a header).
#include <cstdint>

#include "kernels/cuda/block_reduce.cuh"

namespace fab::cuda::norm_rope_kernels {

constexpr int kRowThreads = 256;

// One block per row: rstd = 1 / sqrt(mean(x^2) + eps); y = w * (x * rstd).
__global__ void rmsnorm_forward_kernel(const float* x, const float* w, int64_t c, float eps, float* y, float* rstd) {
  const int64_t r = blockIdx.x;
  const float* xr = x + r * c;
  float ss = 0.0f;
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x) ss += xr[j] * xr[j];
  const float s = rsqrtf(block_sum(ss) / float(c) + eps);
  if (threadIdx.x == 0) rstd[r] = s;
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x) y[r * c + j] = w[j] * (xr[j] * s);
}

// y_j = w_j xhat_j, xhat = x r, r = (mean(x^2) + eps)^-1/2, d r / d x_i = -r^3 x_i / c.
// With g = dy * w:  dx += r (g - xhat mean(g xhat)).  (dw is a column sum, below.)
__global__ void rmsnorm_backward_dx_kernel(const float* x, const float* w, const float* rstd, const float* dy,
                                           int64_t c, float* dx) {
  const int64_t r = blockIdx.x;
  const float* xr = x + r * c;
  const float* dyr = dy + r * c;
  const float s = rstd[r];
  float dot = 0.0f;
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x) dot += dyr[j] * w[j] * xr[j] * s;
  const float mean = block_sum(dot) / float(c);
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x) dx[r * c + j] += s * (dyr[j] * w[j] - xr[j] * s * mean);
}

// dw[j] += sum over rows of dy * xhat: one thread per column, rows split over gridDim.y.
__global__ void rmsnorm_backward_dw_kernel(const float* x, const float* rstd, const float* dy, int64_t rows,
                                           int64_t c, float* dw) {
  const int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= c) return;
  const int64_t per = (rows + gridDim.y - 1) / gridDim.y, r0 = blockIdx.y * per;
  const int64_t r1 = r0 + per < rows ? r0 + per : rows;
  float s = 0.0f;
  for (int64_t r = r0; r < r1; ++r) s += dy[r * c + j] * (x[r * c + j] * rstd[r]);
  if (gridDim.y == 1) dw[j] += s;
  else atomicAdd(&dw[j], s);
}

// rotate_half, h = d/2, one thread per (row, head, pair j):
//   y[j] = x[j] cos - x[j+h] sin;   y[j+h] = x[j+h] cos + x[j] sin      (y may alias x)
__global__ void rope_forward_kernel(const float* x, float* y, const int64_t* positions, const float* cos,
                                    const float* sin, int64_t rows, int64_t heads, int64_t d) {
  const int64_t h = d / 2, total = rows * heads * h;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = e % h, rh = e / h, r = rh / heads, base = rh * d;
    const float c = cos[positions[r] * h + j], s = sin[positions[r] * h + j];
    const float x1 = x[base + j], x2 = x[base + j + h];
    y[base + j] = x1 * c - x2 * s;
    y[base + j + h] = x2 * c + x1 * s;
  }
}

// The transpose of the rotation:  dx[j] += dy[j] cos + dy[j+h] sin;  dx[j+h] += dy[j+h] cos - dy[j] sin
__global__ void rope_backward_kernel(const float* dy, float* dx, const int64_t* positions, const float* cos,
                                     const float* sin, int64_t rows, int64_t heads, int64_t d) {
  const int64_t h = d / 2, total = rows * heads * h;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = e % h, rh = e / h, r = rh / heads, base = rh * d;
    const float c = cos[positions[r] * h + j], s = sin[positions[r] * h + j];
    const float g1 = dy[base + j], g2 = dy[base + j + h];
    dx[base + j] += g1 * c + g2 * s;
    dx[base + j + h] += g2 * c - g1 * s;
  }
}

}  // namespace fab::cuda::norm_rope_kernels
