// Causal grouped-query attention that keeps no (B, H, T, T) tensor: the forward saves only the
// output and each row's log-sum-exp, and the backward recomputes the probabilities from them
// (the flash-attention recipe). Both work on (query block x key block) tiles held in scratch:
// scores are formed transposed, S^T = K Q^T (keys x queries), so that the softmax statistics of
// every query are vector lanes and K is read in place; all products go through the register-
// blocked small_gemm (attention_blocks.h). Key blocks past the diagonal are never visited and
// the diagonal tile is masked. With a document mask (packed rows, AttentionShape::doc_start) the
// key blocks wholly before the earliest document start of the query block are not visited either,
// and only the tiles that reach before the latest start are masked by document; the rest run the
// plain causal code. The forward splits over (batch, head, query block); the backward over
// (batch, kv head), so each task owns the dk/dv rows it writes and nothing races.
#include <omp.h>

#include <cmath>

#include "kernels/cpu/isa_kernels.h"
#include "kernels/cpu/attention_blocks.h"
#include "kernels/cpu/scratch.h"

namespace fab::cpu::FAB_ISA {
namespace {

struct Dims {
  int64_t T, D, Dp, H, group, q_row, kv_row;  // Dp: head_dim padded to whole vectors
  float scale;
  explicit Dims(const AttentionShape& s)
      : T(s.seq),
        D(s.head_dim),
        Dp(round_up(s.head_dim, kLanes)),
        H(s.heads),
        group(s.heads / s.kv_heads),
        q_row(s.heads * s.head_dim),
        kv_row(s.kv_heads * s.head_dim),
        scale(s.scale) {}
};

MatB head_rows(const float* src, int64_t ld, const Dims& d, int64_t n, float* pad) {
  return head_rows(src, ld, d.D, d.Dp, n, pad);
}

// The document starts of one query block as vector lanes, and the key range they need.
struct DocWindow {
  VecI starts[kQueryVecs];  // per query lane: the first key of its document (0 past the block)
  int64_t first_key = 0;    // the first key block to visit (its start)
  int64_t latest = 0;       // key blocks starting before this need the document mask
};

// doc: the row's doc_start, or nullptr (plain causal: every key block from 0, none masked).
DocWindow doc_window(const int32_t* doc, int64_t q0, int64_t nq) {
  DocWindow w;
  if (!doc) return w;
  int64_t lo = doc[q0], hi = doc[q0];
  for (int64_t v = 0; v < kQueryVecs; ++v)
    for (int64_t i = 0; i < kLanes; ++i) {
      const int64_t at = v * kLanes + i;
      w.starts[v][i] = at < nq ? doc[q0 + at] : 0;
      if (at < nq) lo = doc[q0 + at] < lo ? doc[q0 + at] : lo, hi = doc[q0 + at] > hi ? doc[q0 + at] : hi;
    }
  w.first_key = lo / kKeyBlock * kKeyBlock;
  w.latest = hi;
  return w;
}

// x with the lanes whose document starts after `key` replaced by `fill`.
VecF mask_before_start(VecF x, VecI starts, int64_t key, float fill) {
  return VecI{} + int32_t(key) < starts ? VecF{} + fill : x;
}

// ---------------------------------------------------------------------------------------------
// Forward

// The one-process mask of a tile whose key row j sits at j + off from the query block: lanes below
// j + off are masked (key after query), and with kDoc the lanes whose document starts after key
// j0 + j.
template <bool kDoc>
auto causal_mask(int64_t off, const DocWindow& doc, int64_t j0) {
  return [off, &doc, j0](VecF x, int64_t v, int64_t j, float fill) {
    x = mask_below(x, v * kLanes, j + off, fill);
    if constexpr (kDoc) x = mask_before_start(x, doc.starts[v], j0 + j, fill);
    return x;
  };
}

// Query rows q0.. (one block) of head h in batch b: for each key block from the earliest document
// start (0 without a mask) up to the diagonal, S^T = K Q^T, online softmax, O = alpha O + P V; at
// the end out = O / l, lse = m + log(l). doc: batch row b's doc_start, or nullptr.
void forward_block(const float* q, const float* k, const float* v, const Dims& d, int64_t b, int64_t h, int64_t q0,
                   const int32_t* doc, FlashForwardWork w, float* out, float* lse) {
  const int64_t nq = min64(kQueryBlock, d.T - q0), g = h / d.group, end = q0 + nq;
  const DocWindow window = doc_window(doc, q0, nq);
  const float* kb = k + b * d.T * d.kv_row + g * d.D;
  const MatB vb = head_rows(v + b * d.T * d.kv_row + g * d.D, d.kv_row, d, end, w.v_pad);
  pack_transposed(q + (b * d.T + q0) * d.q_row + h * d.D, d.q_row, nq, d.D, w.qt);
  std::memset(w.o, 0, size_t(nq * d.Dp) * sizeof(float));
  for (int64_t i = 0; i < kQueryBlock; ++i) w.m[i] = kNoScore, w.l[i] = 0.0f;
  for (int64_t j0 = window.first_key; j0 < end; j0 += kKeyBlock) {
    const int64_t nk = min64(kKeyBlock, end - j0), off = j0 - q0;
    small_gemm(nk, kQueryBlock, d.D, {kb + j0 * d.kv_row, d.kv_row, 1}, {w.qt, kQueryBlock}, {w.s, kQueryBlock},
               false, Causal::kColumnsFrom, off);
    if (j0 < window.latest)
      online_softmax(w.s, nk, d.scale, w.m, w.l, w.alpha, causal_mask<true>(off, window, j0));
    else
      online_softmax(w.s, nk, d.scale, w.m, w.l, w.alpha, causal_mask<false>(off, window, j0));
    for (int64_t i = 0; i < nq; ++i)
      for (int64_t c = 0; c < d.Dp; c += kLanes)
        store_vec(w.o + i * d.Dp + c, load_vec(w.o + i * d.Dp + c) * w.alpha[i]);
    small_gemm(nq, d.Dp, nk, {w.s, 1, kQueryBlock}, {vb.p + j0 * vb.ld, vb.ld}, {w.o, d.Dp}, true, Causal::kTermsUpTo,
               off);
  }
  for (int64_t i = 0; i < nq; ++i) {
    float* oi = out + (b * d.T + q0 + i) * d.q_row + h * d.D;
    const float inv = 1.0f / w.l[i];
#pragma omp simd
    for (int64_t c = 0; c < d.D; ++c) oi[c] = w.o[i * d.Dp + c] * inv;
    lse[(b * d.H + h) * d.T + q0 + i] = w.m[i] + std::log(w.l[i]);
  }
}

// ---------------------------------------------------------------------------------------------
// Backward

struct BackwardArgs {
  const float *q, *k, *v, *out, *lse, *dout;
  float* dq;
};

// Gradient contributions of query rows q0.. (one block) of head h in batch b: dq rows directly,
// dk/dv into the task's accumulators w.dk, w.dv (T x Dp). kb: K rows of the head as an operand;
// doc: batch row b's doc_start, or nullptr (key blocks before the earliest start are skipped).
void backward_block(const BackwardArgs& a, const Dims& d, int64_t b, int64_t h, int64_t q0, MatB kb,
                    const int32_t* doc, FlashBackwardWork w) {
  const int64_t nq = min64(kQueryBlock, d.T - q0), g = h / d.group, end = q0 + nq;
  const DocWindow window = doc_window(doc, q0, nq);
  const int64_t row0 = (b * d.T + q0) * d.q_row + h * d.D, kv0 = b * d.T * d.kv_row + g * d.D;
  pack_transposed(a.q + row0, d.q_row, nq, d.D, w.qt);
  pack_transposed(a.dout + row0, d.q_row, nq, d.D, w.dot);
  const MatB q_rows = head_rows(a.q + row0, d.q_row, d, nq, w.q_rows);
  const MatB do_rows = head_rows(a.dout + row0, d.q_row, d, nq, w.do_rows);
  for (int64_t i = 0; i < kQueryBlock; ++i) w.lse[i] = w.di[i] = 0.0f;
  for (int64_t i = 0; i < nq; ++i) {
    w.lse[i] = a.lse[(b * d.H + h) * d.T + q0 + i];
    w.di[i] = dot(a.dout + row0 + i * d.q_row, a.out + row0 + i * d.q_row, d.D);  // D_i = do_i . out_i
  }
  std::memset(w.dq, 0, size_t(nq * d.Dp) * sizeof(float));
  for (int64_t j0 = window.first_key; j0 < end; j0 += kKeyBlock) {
    const int64_t nk = min64(kKeyBlock, end - j0), off = j0 - q0;
    const Causal cols = Causal::kColumnsFrom, from = Causal::kTermsFrom, upto = Causal::kTermsUpTo;
    small_gemm(nk, kQueryBlock, d.D, {a.k + kv0 + j0 * d.kv_row, d.kv_row, 1}, {w.qt, kQueryBlock},
               {w.s, kQueryBlock}, false, cols, off);  // S^T = K Q^T
    small_gemm(nk, kQueryBlock, d.D, {a.v + kv0 + j0 * d.kv_row, d.kv_row, 1}, {w.dot, kQueryBlock},
               {w.ds, kQueryBlock}, false, cols, off);  // dP^T = V dO^T
    if (j0 < window.latest)
      probs_and_grads(w.s, w.ds, nk, d.scale, w.lse, w.di, causal_mask<true>(off, window, j0));
    else
      probs_and_grads(w.s, w.ds, nk, d.scale, w.lse, w.di, causal_mask<false>(off, window, j0));
    small_gemm(nk, d.Dp, nq, {w.s, kQueryBlock, 1}, do_rows, {w.dv + j0 * d.Dp, d.Dp}, true, from,
               off);  // dV += P^T dO
    small_gemm(nk, d.Dp, nq, {w.ds, kQueryBlock, 1}, q_rows, {w.dk + j0 * d.Dp, d.Dp}, true, from,
               off);  // dK += dS^T Q
    small_gemm(nq, d.Dp, nk, {w.ds, 1, kQueryBlock}, {kb.p + j0 * kb.ld, kb.ld}, {w.dq, d.Dp}, true, upto,
               off);  // dQ += dS K
  }
  for (int64_t i = 0; i < nq; ++i)
#pragma omp simd
    for (int64_t c = 0; c < d.D; ++c) a.dq[row0 + i * d.q_row + c] += w.dq[i * d.Dp + c];
}

}  // namespace

void attention_forward(const float* q, const float* k, const float* v, const AttentionShape& s, float* out,
                       float* lse) {
  const Dims d(s);
  const int64_t blocks = (d.T + kQueryBlock - 1) / kQueryBlock, heads = s.batch * s.heads;
#pragma omp parallel
  {
    ScratchBuffer buf{size_t(FlashForwardWork::floats(d.D, d.Dp, d.T))};
    const FlashForwardWork w(buf.data(), d.D, d.Dp, d.T);
    // Longest query blocks (latest in the sequence) first, for balance.
#pragma omp for schedule(dynamic)
    for (int64_t t = 0; t < blocks * heads; ++t) {
      const int64_t qblock = blocks - 1 - t / heads, bh = t % heads;
      const int64_t b = bh / s.heads;
      forward_block(q, k, v, d, b, bh % s.heads, qblock * kQueryBlock, s.doc_start ? s.doc_start + b * d.T : nullptr,
                    w, out, lse);
    }
  }
}

// out_i = sum_j p_ij v_j, p_i = softmax(s_i), s_ij = scale q_i . k_j (j <= i, and j at or after
// the start of i's document under a document mask; other p_ij are 0). With do = dL/dout:
//   dv_j += sum_i p_ij do_i
//   dp_ij = do_i . v_j;   ds_ij = p_ij (dp_ij - D_i),  D_i = sum_j p_ij dp_ij = do_i . out_i
//   dq_i += scale sum_j ds_ij k_j;   dk_j += scale sum_i ds_ij q_i
// Per tile, as matrices: P^T and dS^T are formed (keys x queries) from recomputed scores,
// dV += P^T dO, dK += (scale dS)^T Q, dQ += (scale dS) K.
void attention_backward(const float* q, const float* k, const float* v, const float* out, const float* lse,
                        const float* dout, const AttentionShape& s, float* dq, float* dk, float* dv) {
  const Dims d(s);
  const int64_t blocks = (d.T + kQueryBlock - 1) / kQueryBlock;
  const BackwardArgs args{q, k, v, out, lse, dout, dq};
#pragma omp parallel
  {
    ScratchBuffer buf{size_t(FlashBackwardWork::floats(d.D, d.Dp, d.T))};
    const FlashBackwardWork w(buf.data(), d.D, d.Dp, d.T);
#pragma omp for schedule(dynamic)
    for (int64_t t = 0; t < s.batch * s.kv_heads; ++t) {
      const int64_t b = t / s.kv_heads, g = t % s.kv_heads, kv0 = b * d.T * d.kv_row + g * d.D;
      const MatB kb = head_rows(k + kv0, d.kv_row, d, d.T, w.k_pad);
      const int32_t* doc = s.doc_start ? s.doc_start + b * d.T : nullptr;
      std::memset(w.dk, 0, size_t(d.T * d.Dp) * sizeof(float));
      std::memset(w.dv, 0, size_t(d.T * d.Dp) * sizeof(float));
      for (int64_t h = g * d.group; h < (g + 1) * d.group; ++h)
        for (int64_t qb = 0; qb < blocks; ++qb)
          backward_block(args, d, b, h, qb * kQueryBlock, kb, doc, w);
      for (int64_t j = 0; j < d.T; ++j)
#pragma omp simd
        for (int64_t c = 0; c < d.D; ++c) {
          dk[kv0 + j * d.kv_row + c] += w.dk[j * d.Dp + c];
          dv[kv0 + j * d.kv_row + c] += w.dv[j * d.Dp + c];
        }
    }
  }
}

}  // namespace fab::cpu::FAB_ISA
