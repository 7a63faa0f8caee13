// The indexed attention block of context parallelism (attention_ring.h). Each task owns whole
// rows of what it writes: the forward one (batch, head), the backward one (batch, kv head), whose
// query heads' dq rows and whose dk, dv rows no other task touches.
#include "kernels/cpu/attention_ring.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace fab::cpu {
namespace {

float dot(const float* a, const float* b, int64_t n) {
  float sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

void axpy(float a, const float* x, float* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

bool visible(const IndexedAttention& s, int64_t b, int64_t i, int64_t j) {
  const int32_t first = s.query_doc ? s.query_doc[b * s.queries + i] : 0;
  return s.key_index[j] <= s.query_index[i] && s.key_index[j] >= first;
}

// Scores of query row `qi` against every key of kv head g in batch b: score[j] = scale q.k_j for
// visible keys, -inf for the others. Returns the largest (-inf when none is visible).
float scores(const float* qi, const float* k, const IndexedAttention& s, int64_t b, int64_t i, int64_t g,
             float* score) {
  const int64_t D = s.head_dim, kv_row = s.kv_heads * D;
  float most = -INFINITY;
  for (int64_t j = 0; j < s.keys; ++j) {
    score[j] = visible(s, b, i, j) ? s.scale * dot(qi, k + (b * s.keys + j) * kv_row + g * D, D) : -INFINITY;
    most = score[j] > most ? score[j] : most;
  }
  return most;
}

}  // namespace

// Block: m = max_j s_j, l = sum_j e^(s_j - m), o = sum_j e^(s_j - m) v_j / l, lse_b = m + log l.
// Merged with the running (out, lse): lse' = log(e^lse + e^lse_b),
// out' = e^(lse - lse') out + e^(lse_b - lse') o.
void attention_block_forward(const float* q, const float* k, const float* v, const IndexedAttention& s, float* out,
                             float* lse) {
  const int64_t D = s.head_dim, q_row = s.heads * D, kv_row = s.kv_heads * D, group = s.heads / s.kv_heads;
#pragma omp parallel
  {
    std::vector<float> score(static_cast<size_t>(s.keys)), o(static_cast<size_t>(D));
#pragma omp for schedule(dynamic)
    for (int64_t t = 0; t < s.batch * s.heads; ++t) {
      const int64_t b = t / s.heads, h = t % s.heads, g = h / group;
      for (int64_t i = 0; i < s.queries; ++i) {
        const float* qi = q + (b * s.queries + i) * q_row + h * D;
        const float m = scores(qi, k, s, b, i, g, score.data());
        if (m == -INFINITY) continue;  // nothing visible in this block
        float l = 0;
        std::fill(o.begin(), o.end(), 0.0f);
        for (int64_t j = 0; j < s.keys; ++j) {
          if (score[size_t(j)] == -INFINITY) continue;
          const float p = std::exp(score[size_t(j)] - m);
          l += p;
          axpy(p, v + (b * s.keys + j) * kv_row + g * D, o.data(), D);
        }
        float& running = lse[(b * s.heads + h) * s.queries + i];
        const float block = m + std::log(l);
        const float merged = std::max(running, block) + std::log1p(std::exp(-std::fabs(running - block)));
        const float keep = std::exp(running - merged), take = std::exp(block - merged) / l;
        float* oi = out + (b * s.queries + i) * q_row + h * D;
#pragma omp simd
        for (int64_t c = 0; c < D; ++c) oi[c] = keep * oi[c] + take * o[size_t(c)];
        running = merged;
      }
    }
  }
}

// With p_ij = e^(s_ij - lse_i) the final probabilities and D_i = do_i . out_i:
//   dv_j += p_ij do_i;  dp_ij = do_i . v_j;  ds_ij = p_ij (dp_ij - D_i)
//   dq_i += scale ds_ij k_j;  dk_j += scale ds_ij q_i
// (the one-process kernel's backward, kernels/cpu/attention.cpp, restricted to this block's keys).
void attention_block_backward(const float* q, const float* k, const float* v, const float* out, const float* lse,
                              const float* dout, const IndexedAttention& s, float* dq, float* dk, float* dv) {
  const int64_t D = s.head_dim, q_row = s.heads * D, kv_row = s.kv_heads * D, group = s.heads / s.kv_heads;
#pragma omp parallel
  {
    std::vector<float> score(size_t(s.keys));
#pragma omp for schedule(dynamic)
    for (int64_t t = 0; t < s.batch * s.kv_heads; ++t) {
      const int64_t b = t / s.kv_heads, g = t % s.kv_heads;
      for (int64_t h = g * group; h < (g + 1) * group; ++h)
        for (int64_t i = 0; i < s.queries; ++i) {
          const int64_t row = (b * s.queries + i) * q_row + h * D;
          if (scores(q + row, k, s, b, i, g, score.data()) == -INFINITY) continue;
          const float lse_i = lse[(b * s.heads + h) * s.queries + i], d_i = dot(dout + row, out + row, D);
          for (int64_t j = 0; j < s.keys; ++j) {
            if (score[size_t(j)] == -INFINITY) continue;
            const int64_t kv = (b * s.keys + j) * kv_row + g * D;
            const float p = std::exp(score[size_t(j)] - lse_i);
            const float ds = p * (dot(dout + row, v + kv, D) - d_i) * s.scale;
            axpy(p, dout + row, dv + kv, D);
            axpy(ds, q + row, dk + kv, D);
            axpy(ds, k + kv, dq + row, D);
          }
        }
    }
  }
}

}  // namespace fab::cpu
