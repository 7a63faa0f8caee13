// RMSNorm (fp32 statistics, Hugging Face order) and rotate-half RoPE; the reference is
// kernels/cpu/norm_rope.cpp.
#include "kernels/cuda/cuda_util.h"
#include "kernels/cuda/norm_rope_kernels.cuh"
#include "kernels/cuda/kernels.h"

namespace fab::cuda {
namespace {

using namespace norm_rope_kernels;

}  // namespace

void rmsnorm_forward(const float* x, const float* w, int64_t rows, int64_t c, float eps, float* y, float* rstd) {
  if (rows <= 0) return;
  rmsnorm_forward_kernel<<<unsigned(rows), kRowThreads, 0, stream()>>>(x, w, c, eps, y, rstd);
  FAB_CUDA_LAUNCHED("rmsnorm_forward");
}

void rmsnorm_backward(const float* x, const float* w, const float* rstd, const float* dy, int64_t rows, int64_t c,
                      float* dx, float* dw) {
  if (rows <= 0) return;
  rmsnorm_backward_dx_kernel<<<unsigned(rows), kRowThreads, 0, stream()>>>(x, w, rstd, dy, c, dx);
  FAB_CUDA_LAUNCHED("rmsnorm_backward (dx)");
  const unsigned slices = unsigned(rows < 64 ? 1 : rows / 64 < 256 ? rows / 64 : 256);
  rmsnorm_backward_dw_kernel<<<dim3(blocks_for(c, 256), slices), 256, 0, stream()>>>(x, rstd, dy, rows, c, dw);
  FAB_CUDA_LAUNCHED("rmsnorm_backward (dw)");
}

void rope_forward(const float* x, float* y, const int64_t* positions, const float* cos, const float* sin,
                  int64_t rows, int64_t heads, int64_t d) {
  const int64_t n = rows * heads * (d / 2);
  if (n <= 0) return;
  rope_forward_kernel<<<blocks_for(n, 256), 256, 0, stream()>>>(x, y, positions, cos, sin, rows, heads, d);
  FAB_CUDA_LAUNCHED("rope_forward");
}

void rope_backward(const float* dy, float* dx, const int64_t* positions, const float* cos, const float* sin,
                   int64_t rows, int64_t heads, int64_t d) {
  const int64_t n = rows * heads * (d / 2);
  if (n <= 0) return;
  rope_backward_kernel<<<blocks_for(n, 256), 256, 0, stream()>>>(dy, dx, positions, cos, sin, rows, heads, d);
  FAB_CUDA_LAUNCHED("rope_backward");
}

}  // namespace fab::cuda
