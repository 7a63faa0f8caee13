// Embedding, SwiGLU, residual and bias helpers, cross-entropy, AdamW: the memory-bound kernels.
#include <omp.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <bit>

#include "kernels/counter_rng.h"
#include "kernels/cpu/isa_kernels.h"
#include "kernels/cpu/scratch.h"
#include "kernels/cpu/vec_math.h"

namespace fab::cpu::FAB_ISA {

void embedding_forward(const int64_t* ids, int64_t n, const float* table, int64_t first, int64_t rows, int64_t c,
                       float* out) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const int64_t row = ids[i] - first;
    float* dst = out + i * c;
    if (row < 0 || row >= rows) {
      std::fill(dst, dst + c, 0.0f);
      continue;
    }
    const float* src = table + row * c;
#pragma omp simd
    for (int64_t j = 0; j < c; ++j) dst[j] = src[j];
  }
}

// dtable[ids[i] - first, :] += dout[i, :]. Each thread owns a slice of columns, so repeated ids
// never race and the sum order is fixed.
void embedding_backward(const int64_t* ids, int64_t n, const float* dout, int64_t first, int64_t rows, int64_t c,
                        float* dtable) {
#pragma omp parallel
  {
    Range cols = split_range(c, omp_get_num_threads(), omp_get_thread_num());
    for (int64_t i = 0; i < n; ++i) {
      const int64_t row = ids[i] - first;
      if (row < 0 || row >= rows) continue;
      float* dst = dtable + row * c;
      const float* src = dout + i * c;
#pragma omp simd
      for (int64_t j = cols.begin; j < cols.end; ++j) dst[j] += src[j];
    }
  }
}

void swiglu_forward(const float* gate_up, int64_t rows, int64_t i, float* h) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = gate_up + r * 2 * i;
    const float* u = g + i;
    float* out = h + r * i;
#pragma omp simd
    for (int64_t j = 0; j < i; ++j) out[j] = g[j] * sigmoid(g[j]) * u[j];
  }
}

// h = silu(g) u, silu(g) = g s(g), s = sigmoid:
//   dh/du = silu(g);  dh/dg = u s(g) (1 + g (1 - s(g)))
void swiglu_backward(const float* gate_up, const float* dh, int64_t rows, int64_t i, float* dgate_up,
                     bool accumulate) {
  const float keep = accumulate ? 1.0f : 0.0f;  // 0 * (uninitialised) could be NaN: select instead
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = gate_up + r * 2 * i;
    const float* u = g + i;
    const float* d = dh + r * i;
    float* dg = dgate_up + r * 2 * i;
    float* du = dg + i;
#pragma omp simd
    for (int64_t j = 0; j < i; ++j) {
      const float s = sigmoid(g[j]);
      const float old_u = keep != 0.0f ? du[j] : 0.0f, old_g = keep != 0.0f ? dg[j] : 0.0f;
      du[j] = old_u + d[j] * g[j] * s;
      dg[j] = old_g + d[j] * u[j] * s * (1.0f + g[j] * (1.0f - s));
    }
  }
}

// loss_r = logsumexp(z_r) - z_r[y_r];  d loss_r / d z_r = softmax(z_r) - onehot(y_r).
// Three passes over each row: the max; the exponentials, stored in place and summed; the output.
// A row (one vocabulary of floats) stays in L1/L2 between the passes, so storing the exponentials
// costs less than computing them twice.
// The loss sum is reduced in a fixed order: each row's loss is kept, then they are added in row
// order, so the result is the same bits for any thread count and schedule (data-parallel runs
// and resumes stay bitwise reproducible).
double cross_entropy_chunk(float* logits, const int64_t* labels, int64_t rows, int64_t vocab, float scale,
                           bf16* grad_bf16) {
  ScratchBuffer row_losses_buffer{size_t(2 * rows)};  // doubles, zero for ignored rows
  double* row_loss = reinterpret_cast<double*>(row_losses_buffer.data());
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    float* z = logits + r * vocab;
    bf16* out = grad_bf16 ? grad_bf16 + r * vocab : nullptr;
    if (labels[r] == -100) {
      if (out) {
        for (int64_t j = 0; j < vocab; ++j) out[j].bits = 0;
      } else {
#pragma omp simd
        for (int64_t j = 0; j < vocab; ++j) z[j] = 0.0f;
      }
      continue;
    }
    float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
    for (int64_t j = 0; j < vocab; ++j) mx = max_of(mx, z[j]);
    const float target_shifted = z[labels[r]] - mx;
    float sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < vocab; ++j) {
      z[j] = exp_approx(z[j] - mx);
      sum += z[j];
    }
    row_loss[r] = double(std::log(sum)) - double(target_shifted);  // lse - z[y], both shifted by max
    const float inv = scale / sum, target_grad = exp_approx(target_shifted) * inv - scale;
    if (out) {
      uint16_t* bits = &out[0].bits;
#pragma omp simd
      for (int64_t j = 0; j < vocab; ++j) bits[j] = bf16_bits(z[j] * inv);
      out[labels[r]].bits = bf16_bits(target_grad);
    } else {
#pragma omp simd
      for (int64_t j = 0; j < vocab; ++j) z[j] *= inv;
      z[labels[r]] = target_grad;
    }
  }
  double total = 0;
  for (int64_t r = 0; r < rows; ++r) total += row_loss[r];
  return total;
}

void copy_2d(const float* src, int64_t src_ld, float* dst, int64_t dst_ld, int64_t rows, int64_t cols,
             bool accumulate) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* s = src + r * src_ld;
    float* d = dst + r * dst_ld;
    if (accumulate) {
#pragma omp simd
      for (int64_t j = 0; j < cols; ++j) d[j] += s[j];
    } else {
#pragma omp simd
      for (int64_t j = 0; j < cols; ++j) d[j] = s[j];
    }
  }
}

void add(const float* a, const float* b, float* out, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t j = 0; j < n; ++j) out[j] = a[j] + b[j];
}

void vocab_slice_max(const float* z, int64_t n, int64_t slice, int64_t valid, float* row_max) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    float m = -FLT_MAX;
    for (int64_t j = 0; j < valid; ++j) m = std::max(m, z[i * slice + j]);
    row_max[i] = m;
  }
}

void vocab_slice_exp(float* z, const int64_t* labels, int64_t n, int64_t slice, int64_t valid, int64_t vocab_begin,
                     const float* row_max, double* sums) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    float* row = z + i * slice;
    const int64_t t = labels[i] - vocab_begin;
    sums[n + i] = labels[i] != -100 && t >= 0 && t < valid ? row[t] : 0.0;
    const float m = row_max[i];
    double s = 0;
    for (int64_t j = 0; j < valid; ++j) {
      const float e = std::exp(row[j] - m);
      row[j] = e;
      s += e;
    }
    sums[i] = s;
  }
}

void vocab_slice_grad(float* z, const int64_t* labels, int64_t n, int64_t slice, int64_t valid, int64_t vocab_begin,
                      const double* sums, float scale) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    float* row = z + i * slice;
    if (labels[i] == -100) {
      std::fill(row, row + slice, 0.0f);
      continue;
    }
    const float inv = float(1.0 / sums[i]);
    for (int64_t j = 0; j < valid; ++j) row[j] = scale * row[j] * inv;
    std::fill(row + valid, row + slice, 0.0f);
    const int64_t t = labels[i] - vocab_begin;
    if (t >= 0 && t < valid) row[t] -= scale;
  }
}

void multiply(const float* a, const float* b, float* out, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t j = 0; j < n; ++j) out[j] = a[j] * b[j];
}

void dropout_mask(float* mask, int64_t n, uint64_t key, double p, float keep_scale) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) mask[i] = dropout_factor(key, i, p, keep_scale);
}

void accumulate(const float* x, float* out, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t j = 0; j < n; ++j) out[j] += x[j];
}

void add_bias(float* y, const float* bias, int64_t rows, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) y[r * n + j] += bias[j];
  }
}

void bias_backward(const float* dy, int64_t rows, int64_t n, float* db) {
#pragma omp parallel
  {
    Range cols = split_range(n, omp_get_num_threads(), omp_get_thread_num());
    for (int64_t r = 0; r < rows; ++r) {
#pragma omp simd
      for (int64_t j = cols.begin; j < cols.end; ++j) db[j] += dy[r * n + j];
    }
  }
}

void scale(float* x, int64_t n, float s) {
#pragma omp parallel for simd schedule(static)
  for (int64_t j = 0; j < n; ++j) x[j] *= s;
}

// Per block of kBlock elements a float partial sum, then the partials added in block order: the
// same bits for any thread count (the gradient norm, and so clipping, is reproducible).
double sum_squares(const float* x, int64_t n) {
  constexpr int64_t kBlock = 4096;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  ScratchBuffer partials{size_t(blocks)};
  float* partial = partials.data();
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t begin = b * kBlock, end = begin + kBlock < n ? begin + kBlock : n;
    float sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = begin; j < end; ++j) sum += x[j] * x[j];
    partial[b] = sum;
  }
  double total = 0;
  for (int64_t b = 0; b < blocks; ++b) total += partial[b];
  return total;
}

void to_bf16(const float* x, bf16* out, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t j = 0; j < n; ++j) {
    out[j].bits = bf16_bits(x[j]);
  }
}

// torch.optim.AdamW, one tensor:
//   p *= 1 - lr wd;  m = lerp(m, g, 1 - b1);  v = b2 v + (1 - b2) g^2
//   p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// With param_bf16, the bf16 compute copy is written in the same pass. The kernels are compiled
// with -fno-math-errno: otherwise sqrt keeps a scalar errno path and this loop is not vectorised
// (4x slower here).
void adamw_step(float* param, const float* grad, float* m, float* v, int64_t n, const AdamWArgs& a,
                bf16* param_bf16) {
  const float decay = float(1.0 - double(a.lr) * double(a.weight_decay));
  const float step_size = float(double(a.lr) / (1.0 - std::pow(double(a.beta1), double(a.step))));
  const float bc2_sqrt = float(std::sqrt(1.0 - std::pow(double(a.beta2), double(a.step))));
  const float one_minus_b1 = 1.0f - a.beta1, one_minus_b2 = 1.0f - a.beta2, beta2 = a.beta2, eps = a.eps;
  auto update = [=](int64_t j) {
    const float g = grad[j];
    const float p = param[j] * decay;
    m[j] = m[j] + one_minus_b1 * (g - m[j]);
    v[j] = v[j] * beta2 + one_minus_b2 * g * g;
    const float denom = std::sqrt(v[j]) / bc2_sqrt + eps;
    return p - step_size * (m[j] / denom);
  };
  if (param_bf16) {
#pragma omp parallel for simd schedule(static)
    for (int64_t j = 0; j < n; ++j) {
      param[j] = update(j);
      param_bf16[j].bits = bf16_bits(param[j]);
    }
  } else {
#pragma omp parallel for simd schedule(static)
    for (int64_t j = 0; j < n; ++j) param[j] = update(j);
  }
}

}  // namespace fab::cpu::FAB_ISA
