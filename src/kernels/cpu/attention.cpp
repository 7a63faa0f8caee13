// Causal grouped-query attention that keeps no (B, H, T, T) tensor: the forward saves only the
// output and each row's log-sum-exp, and the backward recomputes the probabilities from them
// (the flash-attention recipe). Work is split over (batch, kv head), so each task owns the dk/dv
// rows it writes and nothing races. Scores are computed against K transposed, which turns every
// inner loop into a vectorised axpy over keys or over head_dim.
#include <omp.h>

#include <cmath>

#include "kernels/cpu/isa_kernels.h"
#include "kernels/cpu/scratch.h"
#include "kernels/cpu/vec_math.h"

namespace fab::cpu::FAB_ISA {
namespace {

struct Strides {
  int64_t q_row, kv_row;  // elements between consecutive tokens in q and in k/v
};

// kt (D, T) = k[b, :, g, :] transposed
void transpose_head(const float* k, const AttentionShape& s, int64_t b, int64_t g, float* kt) {
  for (int64_t j = 0; j < s.seq; ++j) {
    const float* src = k + ((b * s.seq + j) * s.kv_heads + g) * s.head_dim;
    for (int64_t d = 0; d < s.head_dim; ++d) kt[d * s.seq + j] = src[d];
  }
}

// scores[j] = sum_d q[d] kt[d, j] for j < n
void scores_row(const float* q, const float* kt, int64_t seq, int64_t head_dim, int64_t n, float* scores) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) scores[j] = 0.0f;
  for (int64_t d = 0; d < head_dim; ++d) {
    const float qd = q[d];
    const float* row = kt + d * seq;
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) scores[j] += qd * row[j];
  }
}

}  // namespace

void attention_forward(const float* q, const float* k, const float* v, const AttentionShape& s, float* out,
                       float* lse) {
  const int64_t T = s.seq, D = s.head_dim, group = s.heads / s.kv_heads;
  const Strides st{s.heads * D, s.kv_heads * D};
#pragma omp parallel
  {
    ScratchBuffer kt_buf{size_t(D * T)}, scores_buf{size_t(T)}, qs_buf{size_t(D)};
    float *kt = kt_buf.data(), *scores = scores_buf.data(), *qs = qs_buf.data();
#pragma omp for schedule(static) collapse(2)
    for (int64_t b = 0; b < s.batch; ++b)
      for (int64_t g = 0; g < s.kv_heads; ++g) {
        transpose_head(k, s, b, g, kt);
        const float* vb = v + b * T * st.kv_row + g * D;
        for (int64_t h = g * group; h < (g + 1) * group; ++h)
          for (int64_t i = 0; i < T; ++i) {
            const float* qi = q + b * T * st.q_row + i * st.q_row + h * D;
#pragma omp simd
            for (int64_t d = 0; d < D; ++d) qs[d] = qi[d] * s.scale;
            const int64_t n = i + 1;  // causal: keys 0..i
            scores_row(qs, kt, T, D, n, scores);
            float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
            for (int64_t j = 0; j < n; ++j) mx = std::fmax(mx, scores[j]);
            float sum = 0;
#pragma omp simd reduction(+ : sum)
            for (int64_t j = 0; j < n; ++j) {
              scores[j] = exp_approx(scores[j] - mx);
              sum += scores[j];
            }
            float* oi = out + b * T * st.q_row + i * st.q_row + h * D;
#pragma omp simd
            for (int64_t d = 0; d < D; ++d) oi[d] = 0.0f;
            const float inv = 1.0f / sum;
            for (int64_t j = 0; j < n; ++j) {
              const float p = scores[j] * inv;
              const float* vj = vb + j * st.kv_row;
#pragma omp simd
              for (int64_t d = 0; d < D; ++d) oi[d] += p * vj[d];
            }
            lse[(b * s.heads + h) * T + i] = mx + std::log(sum);
          }
      }
  }
}

// out_i = sum_j p_ij v_j, p_i = softmax(s_i), s_ij = scale q_i . k_j (j <= i). With do = dL/dout:
//   dv_j += sum_i p_ij do_i
//   dp_ij = do_i . v_j;   ds_ij = p_ij (dp_ij - D_i),  D_i = sum_j p_ij dp_ij = do_i . out_i
//   dq_i += scale sum_j ds_ij k_j;   dk_j += scale sum_i ds_ij q_i
void attention_backward(const float* q, const float* k, const float* v, const float* out, const float* lse,
                        const float* dout, const AttentionShape& s, float* dq, float* dk, float* dv) {
  const int64_t T = s.seq, D = s.head_dim, group = s.heads / s.kv_heads;
  const Strides st{s.heads * D, s.kv_heads * D};
#pragma omp parallel
  {
    ScratchBuffer kt_buf{size_t(D * T)}, vt_buf{size_t(D * T)}, p_buf{size_t(T)}, dp_buf{size_t(T)},
        qs_buf{size_t(D)};
    float *kt = kt_buf.data(), *vt = vt_buf.data(), *p = p_buf.data(), *dp = dp_buf.data(), *qs = qs_buf.data();
#pragma omp for schedule(static) collapse(2)
    for (int64_t b = 0; b < s.batch; ++b)
      for (int64_t g = 0; g < s.kv_heads; ++g) {
        transpose_head(k, s, b, g, kt);
        transpose_head(v, s, b, g, vt);
        const float* kb = k + b * T * st.kv_row + g * D;
        float* dkb = dk + b * T * st.kv_row + g * D;
        float* dvb = dv + b * T * st.kv_row + g * D;
        for (int64_t h = g * group; h < (g + 1) * group; ++h)
          for (int64_t i = 0; i < T; ++i) {
            const int64_t row = b * T * st.q_row + i * st.q_row + h * D;
            const float *qi = q + row, *oi = out + row, *doi = dout + row;
            float* dqi = dq + row;
#pragma omp simd
            for (int64_t d = 0; d < D; ++d) qs[d] = qi[d] * s.scale;
            const int64_t n = i + 1;
            const float row_lse = lse[(b * s.heads + h) * T + i];
            scores_row(qs, kt, T, D, n, p);
#pragma omp simd
            for (int64_t j = 0; j < n; ++j) p[j] = exp_approx(p[j] - row_lse);
            scores_row(doi, vt, T, D, n, dp);
            float di = 0;
#pragma omp simd reduction(+ : di)
            for (int64_t d = 0; d < D; ++d) di += doi[d] * oi[d];
            for (int64_t j = 0; j < n; ++j) {
              const float ds = p[j] * (dp[j] - di) * s.scale;
              const float pj = p[j];
              const float* kj = kb + j * st.kv_row;
              float* dkj = dkb + j * st.kv_row;
              float* dvj = dvb + j * st.kv_row;
#pragma omp simd
              for (int64_t d = 0; d < D; ++d) {
                dqi[d] += ds * kj[d];
                dkj[d] += ds * qi[d];
                dvj[d] += pj * doi[d];
              }
            }
          }
      }
  }
}

}  // namespace fab::cpu::FAB_ISA
