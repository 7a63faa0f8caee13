// Attention for generation with a KV cache: few queries (usually one) against every cached key.
// Per (batch, head, query) row: scores over keys 0..position, softmax in fp32, weighted sum of
// values. Memory-bound on the cache, so a plain row-at-a-time loop is enough.
#include "kernels/cpu/isa_kernels.h"
#include "kernels/cpu/scratch.h"
#include "kernels/cpu/vec_math.h"

namespace fab::cpu::FAB_ISA {

void attention_decode(const float* q, const float* k_cache, const float* v_cache, const AttentionShape& s,
                      int64_t past, int64_t capacity, float* out) {
  const int64_t D = s.head_dim, group = s.heads / s.kv_heads, n = s.seq;
  const int64_t kv_row = s.kv_heads * D, q_row = s.heads * D;
#pragma omp parallel
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
          float mx = -3.0e38f;
          for (int64_t j = 0; j < keys; ++j) {
            float dot = 0;
#pragma omp simd reduction(+ : dot)
            for (int64_t d = 0; d < D; ++d) dot += qi[d] * kb[j * kv_row + d];
            scores[j] = dot * s.scale;
            mx = max_of(mx, scores[j]);
          }
          float sum = 0;
#pragma omp simd reduction(+ : sum)
          for (int64_t j = 0; j < keys; ++j) {
            scores[j] = exp_approx(scores[j] - mx);
            sum += scores[j];
          }
          float* oi = out + (b * n + i) * q_row + h * D;
#pragma omp simd
          for (int64_t d = 0; d < D; ++d) oi[d] = 0.0f;
          for (int64_t j = 0; j < keys; ++j) {
            const float p = scores[j] / sum;
#pragma omp simd
            for (int64_t d = 0; d < D; ++d) oi[d] += p * vb[j * kv_row + d];
          }
        }
  }
}

}  // namespace fab::cpu::FAB_ISA
