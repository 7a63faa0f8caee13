// Attention for generation with a KV cache: few queries (usually one) against every cached key.
// Per (batch, head, query) row: scores over keys 0..position, softmax in fp32, weighted sum of
// values. Memory-bound on the cache. Head widths that are a multiple of the vector (64, 128, ...:
// nearly every model) keep the query and the output row in registers, as GCC vector extensions,
// so each key costs its loads and FMAs only; other widths take the plain loop.
#include "kernels/cpu/isa_kernels.h"
#include "kernels/cpu/scratch.h"
#include "kernels/cpu/vec_ext.h"
#include "kernels/cpu/vec_math.h"

namespace fab::cpu::FAB_ISA {
namespace {

// scores[j] = e^(q.k_j scale - max), returns their sum.
float exp_scores(float* scores, int64_t keys) {
  float mx = -3.0e38f;
#pragma omp simd reduction(max : mx)
  for (int64_t j = 0; j < keys; ++j) mx = max_of(mx, scores[j]);
  float sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < keys; ++j) {
    scores[j] = exp_approx(scores[j] - mx);
    sum += scores[j];
  }
  return sum;
}

// One query row of width Chunks * kLanes.
template <int Chunks>
void attend_row(const float* qi, const float* kb, const float* vb, int64_t keys, int64_t kv_row, float scale,
                float* scores, float* oi) {
  Floats q[Chunks];
  for (int c = 0; c < Chunks; ++c) q[c] = load(qi + c * kLanes);
  for (int64_t j = 0; j < keys; ++j) {
    const float* kj = kb + j * kv_row;
    Floats dot = q[0] * load(kj);
    for (int c = 1; c < Chunks; ++c) dot += q[c] * load(kj + c * kLanes);
    scores[j] = lane_sum(dot) * scale;
  }
  const float inverse_sum = 1.0f / exp_scores(scores, keys);
  Floats acc[Chunks] = {};
  for (int64_t j = 0; j < keys; ++j) {
    const float* vj = vb + j * kv_row;
    for (int c = 0; c < Chunks; ++c) acc[c] += scores[j] * load(vj + c * kLanes);
  }
  for (int c = 0; c < Chunks; ++c) store(oi + c * kLanes, acc[c] * inverse_sum);
}

// Any width: the same maths, one element at a time across the row.
void attend_row_any(const float* qi, const float* kb, const float* vb, int64_t keys, int64_t kv_row, int64_t D,
                    float scale, float* scores, float* oi) {
  for (int64_t j = 0; j < keys; ++j) {
    float dot = 0;
#pragma omp simd reduction(+ : dot)
    for (int64_t d = 0; d < D; ++d) dot += qi[d] * kb[j * kv_row + d];
    scores[j] = dot * scale;
  }
  const float inverse_sum = 1.0f / exp_scores(scores, keys);
#pragma omp simd
  for (int64_t d = 0; d < D; ++d) oi[d] = 0.0f;
  for (int64_t j = 0; j < keys; ++j) {
    const float p = scores[j];
#pragma omp simd
    for (int64_t d = 0; d < D; ++d) oi[d] += p * vb[j * kv_row + d];
  }
#pragma omp simd
  for (int64_t d = 0; d < D; ++d) oi[d] *= inverse_sum;
}

}  // namespace

void attention_decode(const float* q, const float* k_cache, const float* v_cache, const AttentionShape& s,
                      int64_t past, int64_t capacity, float* out) {
  const int64_t D = s.head_dim, group = s.heads / s.kv_heads, n = s.seq;
  const int64_t kv_row = s.kv_heads * D, q_row = s.heads * D;
#pragma omp parallel if (s.batch * s.heads * n > 1)
  {
    ScratchBuffer scores_buf{size_t(past + n)};
    float* scores = scores_buf.data();
#pragma omp for collapse(3) schedule(static)
    for (int64_t b = 0; b < s.batch; ++b)
      for (int64_t h = 0; h < s.heads; ++h)
        for (int64_t i = 0; i < n; ++i) {
          const float* qi = q + (b * n + i) * q_row + h * D;
          const float* kb = k_cache + b * capacity * kv_row + (h / group) * D;
          const float* vb = v_cache + b * capacity * kv_row + (h / group) * D;
          const int64_t keys = past + i + 1;  // causal: up to this query's own position
          float* oi = out + (b * n + i) * q_row + h * D;
          switch (D / kLanes * (D % kLanes == 0)) {
            case 1: attend_row<1>(qi, kb, vb, keys, kv_row, s.scale, scores, oi); break;
            case 2: attend_row<2>(qi, kb, vb, keys, kv_row, s.scale, scores, oi); break;
            case 4: attend_row<4>(qi, kb, vb, keys, kv_row, s.scale, scores, oi); break;
            case 8: attend_row<8>(qi, kb, vb, keys, kv_row, s.scale, scores, oi); break;
            case 16: attend_row<16>(qi, kb, vb, keys, kv_row, s.scale, scores, oi); break;
            default: attend_row_any(qi, kb, vb, keys, kv_row, D, s.scale, scores, oi);
          }
        }
  }
}

}  // namespace fab::cpu::FAB_ISA
