#pragma once
// The memory-bound kernels of elementwise.cu (embedding, SwiGLU, cross-entropy, residual and bias
// helpers, sums, to_bf16, AdamW), device code only, so that tests/kernels/cuda_emulation_test.cpp
// can compile them for the CPU with CUDA's built-ins emulated. Include <cuda_bf16.h> first (the
// emulation supplies its own __float2bfloat16_rn / __bfloat16_as_ushort).
#include <cmath>
#include <cfloat>
#include <cstdint>

#include "kernels/counter_rng.h"
#include "kernels/cuda/block_reduce.cuh"

namespace fab::cuda::elementwise_kernels {

constexpr int kThreads = 256;

__device__ __forceinline__ uint16_t bf16_bits(float x) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(x));  // round to nearest even, as the CPU
}

__device__ __forceinline__ float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

// Grid-stride loop over [0, n).
#define FAB_FOR_EACH(j, n) \
  for (int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; j < (n); j += int64_t(gridDim.x) * blockDim.x)

__global__ void embedding_forward_kernel(const int64_t* ids, int64_t n, const float* table, int64_t first,
                                         int64_t rows, int64_t c, float* out) {
  FAB_FOR_EACH(e, n * c) {
    const int64_t row = ids[e / c] - first;
    out[e] = row >= 0 && row < rows ? table[row * c + e % c] : 0.0f;
  }
}

// dtable[ids[i] - first, :] += dout[i, :]. A thread per column adds the rows in order, as the CPU
// kernel does: no atomics, so the sums (and a resumed run) are the same bits every time, and the
// CPU's. Reads and writes are coalesced across a warp's consecutive columns.
__global__ void embedding_backward_kernel(const int64_t* ids, int64_t n, const float* dout, int64_t first,
                                          int64_t rows, int64_t c, float* dtable) {
  FAB_FOR_EACH(j, c)
  for (int64_t i = 0; i < n; ++i) {
    const int64_t row = ids[i] - first;
    if (row >= 0 && row < rows) dtable[row * c + j] += dout[i * c + j];
  }
}

__global__ void swiglu_forward_kernel(const float* gate_up, int64_t rows, int64_t i, float* h) {
  FAB_FOR_EACH(e, rows * i) {
    const int64_t r = e / i, j = e % i;
    const float g = gate_up[r * 2 * i + j], u = gate_up[r * 2 * i + i + j];
    h[e] = g * sigmoidf(g) * u;
  }
}

// h = silu(g) u, silu(g) = g s(g), s = sigmoid:
//   dh/du = silu(g);  dh/dg = u s(g) (1 + g (1 - s(g)))
__global__ void swiglu_backward_kernel(const float* gate_up, const float* dh, int64_t rows, int64_t i,
                                       float* dgate_up, bool accumulate) {
  FAB_FOR_EACH(e, rows * i) {
    const int64_t r = e / i, j = e % i, at = r * 2 * i + j;
    const float g = gate_up[at], u = gate_up[at + i], d = dh[e], s = sigmoidf(g);
    const float du = d * g * s, dg = d * u * s * (1.0f + g * (1.0f - s));
    dgate_up[at] = accumulate ? dgate_up[at] + dg : dg;  // select, never 0 * (uninitialised)
    dgate_up[at + i] = accumulate ? dgate_up[at + i] + du : du;
  }
}

// One block per row. loss_r = logsumexp(z_r) - z_r[y_r];  d loss_r / d z_r = softmax(z_r) - onehot(y_r),
// times `scale`, written over the logits or into grad_bf16. Three passes over the row, as the CPU.
__global__ void cross_entropy_kernel(float* logits, const int64_t* labels, int64_t vocab, float scale,
                                     uint16_t* grad_bf16, double* row_loss) {
  const int64_t r = blockIdx.x, label = labels[r];
  float* z = logits + r * vocab;
  uint16_t* out = grad_bf16 ? grad_bf16 + r * vocab : nullptr;
  if (label == -100) {
    for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
      if (out) out[j] = 0;
      else z[j] = 0.0f;
    }
    if (threadIdx.x == 0) row_loss[r] = 0.0;
    return;
  }
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) mx = fmaxf(mx, z[j]);
  mx = block_max(mx);
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) sum += expf(z[j] - mx);
  sum = block_sum(sum);
  const float target_shifted = z[label] - mx;  // read by every thread before any write below
  __syncthreads();
  const float inv = scale / sum;
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
    const float p = expf(z[j] - mx) * inv, g = j == label ? p - scale : p;
    if (out) out[j] = bf16_bits(g);
    else z[j] = g;
  }
  if (threadIdx.x == 0) row_loss[r] = double(logf(sum)) - double(target_shifted);
}

// The vocabulary-parallel cross-entropy's passes (kernel_table.h), a block per row.
__global__ void vocab_slice_max_kernel(const float* z, int64_t slice, int64_t valid, float* row_max) {
  const float* row = z + int64_t(blockIdx.x) * slice;
  float m = -FLT_MAX;
  for (int64_t j = threadIdx.x; j < valid; j += blockDim.x) m = fmaxf(m, row[j]);
  m = block_max(m);
  if (threadIdx.x == 0) row_max[blockIdx.x] = m;
}

__global__ void vocab_slice_exp_kernel(float* z, const int64_t* labels, int64_t n, int64_t slice, int64_t valid,
                                       int64_t vocab_begin, const float* row_max, double* sums) {
  const int64_t i = blockIdx.x, t = labels[i] - vocab_begin;
  float* row = z + i * slice;
  if (threadIdx.x == 0) sums[n + i] = labels[i] != -100 && t >= 0 && t < valid ? double(row[t]) : 0.0;
  __syncthreads();  // the target's logit is read before the row turns into exponentials
  const float m = row_max[i];
  double s = 0;
  for (int64_t j = threadIdx.x; j < valid; j += blockDim.x) {
    const float e = expf(row[j] - m);
    row[j] = e;
    s += e;
  }
  s = block_sum(s);
  if (threadIdx.x == 0) sums[i] = s;
}

__global__ void vocab_slice_grad_kernel(float* z, const int64_t* labels, int64_t slice, int64_t valid,
                                        int64_t vocab_begin, const double* sums, float scale) {
  const int64_t i = blockIdx.x, t = labels[i] - vocab_begin;
  float* row = z + i * slice;
  const bool ignored = labels[i] == -100;
  const float inv = ignored ? 0.0f : float(1.0 / sums[i]);
  for (int64_t j = threadIdx.x; j < slice; j += blockDim.x) {
    float g = ignored || j >= valid ? 0.0f : scale * row[j] * inv;
    if (!ignored && j == t) g -= scale;
    row[j] = g;
  }
}

// Sums `n` doubles in a fixed order (one block): deterministic losses.
__global__ void sum_doubles_kernel(const double* x, int64_t n, double* out) {
  double s = 0;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) s += x[j];
  s = block_sum(s);
  if (threadIdx.x == 0) *out = s;
}

__global__ void copy_2d_kernel(const float* src, int64_t src_ld, float* dst, int64_t dst_ld, int64_t rows,
                               int64_t cols, bool accumulate) {
  FAB_FOR_EACH(e, rows * cols) {
    const int64_t r = e / cols, j = e % cols;
    const float s = src[r * src_ld + j];
    float* d = dst + r * dst_ld + j;
    *d = accumulate ? *d + s : s;
  }
}

__global__ void add_kernel(const float* a, const float* b, float* out, int64_t n) { FAB_FOR_EACH(j, n) out[j] = a[j] + b[j]; }
__global__ void multiply_kernel(const float* a, const float* b, float* out, int64_t n) {
  FAB_FOR_EACH(j, n) out[j] = a[j] * b[j];
}
__global__ void accumulate_kernel(const float* x, float* out, int64_t n) { FAB_FOR_EACH(j, n) out[j] += x[j]; }
__global__ void dropout_mask_kernel(float* mask, int64_t n, uint64_t key, double p, float keep_scale) {
  FAB_FOR_EACH(i, n) mask[i] = dropout_factor(key, i, p, keep_scale);
}
__global__ void scale_kernel(float* x, int64_t n, float s) { FAB_FOR_EACH(j, n) x[j] *= s; }
__global__ void add_bias_kernel(float* y, const float* bias, int64_t rows, int64_t n) {
  FAB_FOR_EACH(e, rows * n) y[e] += bias[e % n];
}
__global__ void to_bf16_kernel(const float* x, uint16_t* out, int64_t n) { FAB_FOR_EACH(j, n) out[j] = bf16_bits(x[j]); }

// out[j] (+)= sum over rows of x[r, j], rows split over gridDim.y slices added by atomics.
__global__ void column_sum_kernel(const float* x, int64_t rows, int64_t n, float* out) {
  const int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= n) return;
  const int64_t per = (rows + gridDim.y - 1) / gridDim.y, r0 = blockIdx.y * per;
  const int64_t r1 = r0 + per < rows ? r0 + per : rows;
  float s = 0.0f;
  for (int64_t r = r0; r < r1; ++r) s += x[r * n + j];
  if (gridDim.y == 1) out[j] += s;
  else atomicAdd(&out[j], s);
}

// Per-block partial sums of squares in fp32 (like the CPU's 4096-element blocks), then summed in
// double in a fixed order.
__global__ void sum_squares_kernel(const float* x, int64_t n, double* partial) {
  float s = 0.0f;
  FAB_FOR_EACH(j, n) s += x[j] * x[j];
  s = block_sum(s);
  if (threadIdx.x == 0) partial[blockIdx.x] = double(s);
}

// One block over the whole vector: the maximum, then weight = exp((logit - max) t) and their sum
// (in double) at total[0].
__global__ void sampling_weights_kernel(const float* logits, int64_t n, float inverse_temperature, float* weight,
                                        double* total) {
  float top = -FLT_MAX;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) top = fmaxf(top, logits[j]);
  top = block_max(top);
  double s = 0;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    const float w = expf((logits[j] - top) * inverse_temperature);
    weight[j] = w;
    s += double(w);
  }
  s = block_sum(s);
  if (threadIdx.x == 0) total[0] = s;
}

// torch.optim.AdamW, one tensor (see the CPU kernel): p *= 1 - lr wd; m = lerp(m, g, 1 - b1);
// v = b2 v + (1 - b2) g^2; p -= step_size m / (sqrt(v) / sqrt(1 - b2^t) + eps)
__global__ void adamw_kernel(float* param, const float* grad, float* m, float* v, int64_t n, float decay,
                             float step_size, float bc2_sqrt, float beta2, float one_minus_b1,
                             float one_minus_b2, float eps, uint16_t* param_bf16) {
  FAB_FOR_EACH(j, n) {
    const float g = grad[j], p = param[j] * decay;
    const float mj = m[j] + one_minus_b1 * (g - m[j]);
    const float vj = v[j] * beta2 + one_minus_b2 * g * g;
    m[j] = mj;
    v[j] = vj;
    const float out = p - step_size * (mj / (sqrtf(vj) / bc2_sqrt + eps));
    param[j] = out;
    if (param_bf16) param_bf16[j] = bf16_bits(out);
  }
}

}  // namespace fab::cuda::elementwise_kernels
