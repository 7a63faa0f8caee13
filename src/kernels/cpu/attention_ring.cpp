// The indexed attention block of context parallelism (attention_ring.h), in the tiles of the
// one-process flash kernel (attention.cpp): a block of kQueryBlock queries against kKeyBlock keys
// at a time, scores formed transposed (S^T = K Q^T, the queries' softmax statistics as vector
// lanes) and every product through the register-blocked small_gemm (attention_blocks.h). The mask
// is spelled with indices, lane by lane: query i sees key j when doc_i <= key_index[j] <= index_i.
// A key tile that no query of the tile sees -- all its keys after the latest query, or before the
// earliest document start -- is skipped, which is most of them: a rank's tokens are two contiguous
// chunks of the row. Built once, with the library's AVX2 flags (no AVX-512 copy): the forward
// splits over (batch, head, query tile), the backward over (batch, kv head), whose dk/dv rows no
// other task writes.
#define FAB_ISA avx2
#include "kernels/cpu/attention_ring.h"

#include <omp.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>

#include "kernels/cpu/attention_blocks.h"
#include "kernels/cpu/scratch.h"

namespace fab::cpu {
namespace {

using namespace avx2;

struct RingDims {
  int64_t D, Dp, q_row, kv_row, group;
  explicit RingDims(const IndexedAttention& s)
      : D(s.head_dim),
        Dp(round_up(s.head_dim, kLanes)),
        q_row(s.heads * s.head_dim),
        kv_row(s.kv_heads * s.head_dim),
        group(s.heads / s.kv_heads) {}
};

// One query tile's indices as vector lanes: each query's index in the row and its document's
// first index. Lanes past the tile's queries see no key (index INT_MIN).
struct QueryLanes {
  VecI index[kQueryVecs], doc[kQueryVecs];
  int32_t latest = INT_MIN, earliest_doc = INT_MAX;
  QueryLanes(const IndexedAttention& s, int64_t b, int64_t q0, int64_t nq) {
    for (int64_t v = 0; v < kQueryVecs; ++v)
      for (int64_t lane = 0; lane < kLanes; ++lane) {
        const int64_t i = v * kLanes + lane;
        const bool real = i < nq;
        index[v][lane] = real ? s.query_index[q0 + i] : INT_MIN;
        doc[v][lane] = real && s.query_doc ? s.query_doc[b * s.queries + q0 + i] : 0;
        if (real) {
          latest = std::max(latest, index[v][lane]);
          earliest_doc = std::min(earliest_doc, doc[v][lane]);
        }
      }
  }
  // x where query lane sees key index `key`, else `fill`.
  VecF mask(VecF x, int64_t v, int32_t key, float fill) const {
    const VecI k = VecI{} + key;
    return (k <= index[v]) & (k >= doc[v]) ? x : VecF{} + fill;
  }
  // The tile mask of keys[0..]: mask(x, v, j, fill) is x where query lane vector v sees key row j.
  auto mask_for(const int32_t* keys) const {
    return [this, keys](VecF x, int64_t v, int64_t j, float fill) { return mask(x, v, keys[j], fill); };
  }
  // Whether some query of the tile sees some key of keys [j0, j0 + nk).
  bool sees_any(const int32_t* key_index, int64_t j0, int64_t nk) const {
    for (int64_t j = j0; j < j0 + nk; ++j)
      if (key_index[j] <= latest && key_index[j] >= earliest_doc) return true;
    return false;
  }
};

// ---------------------------------------------------------------------------------------------
// Forward

// Query rows q0.. (one tile) of head h in batch b against every key tile they see, then folded
// into the running (out, lse) of those rows.
void forward_tile(const float* q, const float* k, const float* v, const IndexedAttention& s, const RingDims& d,
                  int64_t b, int64_t h, int64_t q0, FlashForwardWork w, float* out, float* lse) {
  const int64_t nq = min64(kQueryBlock, s.queries - q0), g = h / d.group;
  const QueryLanes lanes(s, b, q0, nq);
  const int64_t kv0 = b * s.keys * d.kv_row + g * d.D;
  const MatB vb = head_rows(v + kv0, d.kv_row, d.D, d.Dp, s.keys, w.v_pad);
  pack_transposed(q + (b * s.queries + q0) * d.q_row + h * d.D, d.q_row, nq, d.D, w.qt);
  std::memset(w.o, 0, size_t(nq * d.Dp) * sizeof(float));
  for (int64_t i = 0; i < kQueryBlock; ++i) w.m[i] = kNoScore, w.l[i] = 0.0f;
  for (int64_t j0 = 0; j0 < s.keys; j0 += kKeyBlock) {
    const int64_t nk = min64(kKeyBlock, s.keys - j0);
    if (!lanes.sees_any(s.key_index, j0, nk)) continue;
    small_gemm(nk, kQueryBlock, d.D, {k + kv0 + j0 * d.kv_row, d.kv_row, 1}, {w.qt, kQueryBlock}, {w.s, kQueryBlock},
               false);
    online_softmax(w.s, nk, s.scale, w.m, w.l, w.alpha, lanes.mask_for(s.key_index + j0));
    for (int64_t i = 0; i < nq; ++i)
      for (int64_t c = 0; c < d.Dp; c += kLanes) store_vec(w.o + i * d.Dp + c, load_vec(w.o + i * d.Dp + c) * w.alpha[i]);
    small_gemm(nq, d.Dp, nk, {w.s, 1, kQueryBlock}, {vb.p + j0 * vb.ld, vb.ld}, {w.o, d.Dp}, true);
  }
  for (int64_t i = 0; i < nq; ++i) {
    if (w.l[i] == 0.0f) continue;  // no key of this block is visible to the query
    float& running = lse[(b * s.heads + h) * s.queries + q0 + i];
    const float block = w.m[i] + std::log(w.l[i]);
    const float merged = std::max(running, block) + std::log1p(std::exp(-std::fabs(running - block)));
    const float keep = std::exp(running - merged), take = std::exp(block - merged) / w.l[i];
    float* oi = out + (b * s.queries + q0 + i) * d.q_row + h * d.D;
#pragma omp simd
    for (int64_t c = 0; c < d.D; ++c) oi[c] = keep * oi[c] + take * w.o[i * d.Dp + c];
    running = merged;
  }
}

// ---------------------------------------------------------------------------------------------
// Backward

struct RingBackwardArgs {
  const float *q, *k, *v, *out, *lse, *dout;
  float* dq;
};

// Query rows q0.. (one tile) of head h in batch b: dq rows directly, dk/dv into the task's
// accumulators w.dk, w.dv (keys x Dp). kb: this kv head's K rows as an operand.
void backward_tile(const RingBackwardArgs& a, const IndexedAttention& s, const RingDims& d, int64_t b, int64_t h,
                   int64_t q0, MatB kb, FlashBackwardWork w) {
  const int64_t nq = min64(kQueryBlock, s.queries - q0), g = h / d.group;
  const QueryLanes lanes(s, b, q0, nq);
  const int64_t row0 = (b * s.queries + q0) * d.q_row + h * d.D, kv0 = b * s.keys * d.kv_row + g * d.D;
  pack_transposed(a.q + row0, d.q_row, nq, d.D, w.qt);
  pack_transposed(a.dout + row0, d.q_row, nq, d.D, w.dot);
  const MatB q_rows = head_rows(a.q + row0, d.q_row, d.D, d.Dp, nq, w.q_rows);
  const MatB do_rows = head_rows(a.dout + row0, d.q_row, d.D, d.Dp, nq, w.do_rows);
  for (int64_t i = 0; i < kQueryBlock; ++i) w.lse[i] = w.di[i] = 0.0f;
  for (int64_t i = 0; i < nq; ++i) {
    w.lse[i] = a.lse[(b * s.heads + h) * s.queries + q0 + i];
    w.di[i] = dot(a.dout + row0 + i * d.q_row, a.out + row0 + i * d.q_row, d.D);  // D_i = do_i . out_i
  }
  std::memset(w.dq, 0, size_t(nq * d.Dp) * sizeof(float));
  for (int64_t j0 = 0; j0 < s.keys; j0 += kKeyBlock) {
    const int64_t nk = min64(kKeyBlock, s.keys - j0);
    if (!lanes.sees_any(s.key_index, j0, nk)) continue;
    small_gemm(nk, kQueryBlock, d.D, {a.k + kv0 + j0 * d.kv_row, d.kv_row, 1}, {w.qt, kQueryBlock},
               {w.s, kQueryBlock}, false);  // S^T = K Q^T
    small_gemm(nk, kQueryBlock, d.D, {a.v + kv0 + j0 * d.kv_row, d.kv_row, 1}, {w.dot, kQueryBlock},
               {w.ds, kQueryBlock}, false);  // dP^T = V dO^T
    probs_and_grads(w.s, w.ds, nk, s.scale, w.lse, w.di, lanes.mask_for(s.key_index + j0));
    small_gemm(nk, d.Dp, nq, {w.s, kQueryBlock, 1}, do_rows, {w.dv + j0 * d.Dp, d.Dp}, true);   // dV += P^T dO
    small_gemm(nk, d.Dp, nq, {w.ds, kQueryBlock, 1}, q_rows, {w.dk + j0 * d.Dp, d.Dp}, true);  // dK += dS^T Q
    small_gemm(nq, d.Dp, nk, {w.ds, 1, kQueryBlock}, {kb.p + j0 * kb.ld, kb.ld}, {w.dq, d.Dp}, true);  // dQ += dS K
  }
  for (int64_t i = 0; i < nq; ++i)
#pragma omp simd
    for (int64_t c = 0; c < d.D; ++c) a.dq[row0 + i * d.q_row + c] += w.dq[i * d.Dp + c];
}

}  // namespace

// Block: m = max_j s_j, l = sum_j e^(s_j - m), o = sum_j e^(s_j - m) v_j / l, lse_b = m + log l.
// Merged with the running (out, lse): lse' = log(e^lse + e^lse_b),
// out' = e^(lse - lse') out + e^(lse_b - lse') o.
void attention_block_forward(const float* q, const float* k, const float* v, const IndexedAttention& s, float* out,
                             float* lse) {
  const RingDims d(s);
  const int64_t tiles = (s.queries + kQueryBlock - 1) / kQueryBlock;
#pragma omp parallel
  {
    ScratchBuffer buf{size_t(FlashForwardWork::floats(d.D, d.Dp, s.keys))};
    const FlashForwardWork w(buf.data(), d.D, d.Dp, s.keys);
#pragma omp for schedule(dynamic)
    for (int64_t t = 0; t < tiles * s.batch * s.heads; ++t) {
      const int64_t bh = t % (s.batch * s.heads);
      forward_tile(q, k, v, s, d, bh / s.heads, bh % s.heads, t / (s.batch * s.heads) * kQueryBlock, w, out, lse);
    }
  }
}

// With p_ij = e^(s_ij - lse_i) the final probabilities and D_i = do_i . out_i:
//   dv_j += p_ij do_i;  dp_ij = do_i . v_j;  ds_ij = p_ij (dp_ij - D_i)
//   dq_i += scale ds_ij k_j;  dk_j += scale ds_ij q_i
// (the one-process kernel's backward, kernels/cpu/attention.cpp, restricted to this block's keys).
void attention_block_backward(const float* q, const float* k, const float* v, const float* out, const float* lse,
                              const float* dout, const IndexedAttention& s, float* dq, float* dk, float* dv) {
  const RingDims d(s);
  const int64_t tiles = (s.queries + kQueryBlock - 1) / kQueryBlock;
  const RingBackwardArgs args{q, k, v, out, lse, dout, dq};
#pragma omp parallel
  {
    ScratchBuffer buf{size_t(FlashBackwardWork::floats(d.D, d.Dp, s.keys))};
    const FlashBackwardWork w(buf.data(), d.D, d.Dp, s.keys);
#pragma omp for schedule(dynamic)
    for (int64_t t = 0; t < s.batch * s.kv_heads; ++t) {
      const int64_t b = t / s.kv_heads, g = t % s.kv_heads, kv0 = b * s.keys * d.kv_row + g * d.D;
      const MatB kb = head_rows(k + kv0, d.kv_row, d.D, d.Dp, s.keys, w.k_pad);
      std::memset(w.dk, 0, size_t(s.keys * d.Dp) * sizeof(float));
      std::memset(w.dv, 0, size_t(s.keys * d.Dp) * sizeof(float));
      for (int64_t h = g * d.group; h < (g + 1) * d.group; ++h)
        for (int64_t qt = 0; qt < tiles; ++qt) backward_tile(args, s, d, b, h, qt * kQueryBlock, kb, w);
      for (int64_t j = 0; j < s.keys; ++j)
#pragma omp simd
        for (int64_t c = 0; c < d.D; ++c) {
          dk[kv0 + j * d.kv_row + c] += w.dk[j * d.Dp + c];
          dv[kv0 + j * d.kv_row + c] += w.dv[j * d.Dp + c];
        }
    }
  }
}

}  // namespace fab::cpu
