#pragma once
// Building blocks of the blocked attention kernels (attention.cpp, attention_ring.cpp): a
// native-width float vector, a vector exp, a register-blocked small-matrix product, and the tile
// sizes and operand packing both kernels share. Everything lives in an
// anonymous namespace inside the per-ISA namespace, so the AVX-512 and AVX2 objects never share
// a definition. GCC vector extensions compile to AVX-512 or AVX2 code from the same source.
#include <cmath>
#include <cstdint>
#include <cstring>

#ifndef FAB_ISA
#error "include isa_kernels.h first"
#endif

namespace fab::cpu::FAB_ISA {
namespace {

#if defined(__AVX512F__)
constexpr int64_t kLanes = 16;  // floats per vector
constexpr int kTileRows = 8, kTileVecs = 2;  // register tile: 16 accumulators of 32 registers
#else
constexpr int64_t kLanes = 8;
constexpr int kTileRows = 6, kTileVecs = 2;  // 12 accumulators of 16 registers
#endif

typedef float VecF __attribute__((vector_size(kLanes * 4)));
typedef int32_t VecI __attribute__((vector_size(kLanes * 4)));

inline VecF load_vec(const float* p) {
  VecF v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store_vec(float* p, VecF v) { std::memcpy(p, &v, sizeof v); }

inline VecI lane_index() {
  VecI v;
  for (int i = 0; i < kLanes; ++i) v[i] = i;
  return v;
}

// x with the lanes whose column (first + lane) is below `limit` replaced by `fill`.
inline VecF mask_below(VecF x, int64_t first, int64_t limit, float fill) {
  const VecI below = lane_index() + int32_t(first) < int32_t(limit);
  return below ? VecF{} + fill : x;
}

// Shuffle indices (b's lanes numbered from kLanes) that swap the off-diagonal sub-blocks of
// width W between the rows a and b of a pair: the new a (second = false) or the new b.
template <int W>
VecI swap_mask(bool second) {
  VecI m;
  for (int c = 0; c < kLanes; ++c)
    m[c] = second ? ((c & W) ? c + kLanes : c + W) : ((c & W) ? c - W + kLanes : c);
  return m;
}
// Butterfly stages W, W/2, ..., 1 of a transpose, on rows whose index differs in bit W.
template <int W>
void butterfly(VecF* rows) {
  for (int r = 0; r < kLanes; ++r)
    if (!(r & W)) {
      const VecF a = rows[r], b = rows[r + W];
      rows[r] = __builtin_shuffle(a, b, swap_mask<W>(false));
      rows[r + W] = __builtin_shuffle(a, b, swap_mask<W>(true));
    }
  if constexpr (W > 1) butterfly<W / 2>(rows);
}
// The kLanes x kLanes block at src (row stride ld) transposed into dst (row stride ldd).
inline void transpose_block(const float* src, int64_t ld, float* dst, int64_t ldd) {
  VecF rows[kLanes];
  for (int r = 0; r < kLanes; ++r) rows[r] = load_vec(src + r * ld);
  butterfly<kLanes / 2>(rows);
  for (int r = 0; r < kLanes; ++r) store_vec(dst + r * ldd, rows[r]);
}

// exp_approx (vec_math.h) on a whole vector: the same clamps, range reduction and polynomial.
inline VecF exp_vec(VecF x) {
  x = x < -87.3f ? VecF{} - 87.3f : x;
  x = x > 88.7f ? VecF{} + 88.7f : x;
  const VecF rounder = VecF{} + 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const VecF n = (x * 1.44269504088896341f + rounder) - rounder;
  const VecF r = x - n * 0.693359375f + n * 2.12194440e-4f;
  VecF p = VecF{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const VecI bits = (__builtin_convertvector(n, VecI) + 127) << 23;
  VecF scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

// Operands of the small products: A(i, p) = a[i * row_stride + p * k_stride] is read one scalar
// at a time (so it may be a transposed view), B and C are row-major with whole vectors per row.
struct MatA {
  const float* p;
  int64_t row_stride, k_stride;
};
struct MatB {
  const float* p;
  int64_t ld;
};
struct MatC {
  float* p;
  int64_t ld;
};

// C[R x C vectors] (+)= A[R x k] B[k x C vectors], the tile held in registers.
template <int R, int C>
void tile_product(MatA a, MatB b, MatC c, int64_t k, bool accumulate) {
  VecF acc[R][C];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < C; ++v) acc[r][v] = accumulate ? load_vec(c.p + r * c.ld + v * kLanes) : VecF{};
  for (int64_t p = 0; p < k; ++p) {
    VecF bv[C];
#pragma GCC unroll 8
    for (int v = 0; v < C; ++v) bv[v] = load_vec(b.p + p * b.ld + v * kLanes);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const float ar = a.p[r * a.row_stride + p * a.k_stride];
#pragma GCC unroll 8
      for (int v = 0; v < C; ++v) acc[r][v] += ar * bv[v];
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < C; ++v) store_vec(c.p + r * c.ld + v * kLanes, acc[r][v]);
}

using TileFn = void (*)(MatA, MatB, MatC, int64_t, bool);

// The tile_product instance for a (rows <= R) x (vecs <= C) edge tile.
template <int R, int C>
TileFn pick_tile(int rows, int vecs) {
  if constexpr (R > 1)
    if (rows < R) return pick_tile<R - 1, C>(rows, vecs);
  if constexpr (C > 1)
    if (vecs < C) return pick_tile<R, C - 1>(rows, vecs);
  return tile_product<R, C>;
}

// Causal structure of a diagonal tile, with row r of C and offset `off` (see small_gemm).
enum class Causal {
  kNone,
  kColumnsFrom,  // row r needs only the columns c >= r + off; the others may be left unwritten
  kTermsUpTo,    // A(r, p) = 0 for p > r - off
  kTermsFrom,    // A(r, p) = 0 for p < r + off
};

// C (m x n) (+)= A (m x k) B (k x n), n a multiple of kLanes, in register tiles; `causal` and
// `off` let a diagonal tile skip the work that masking makes useless.
void small_gemm(int64_t m, int64_t n, int64_t k, MatA a, MatB b, MatC c, bool accumulate,
                Causal causal = Causal::kNone, int64_t off = 0) {
  for (int64_t r0 = 0; r0 < m; r0 += kTileRows) {
    const int rows = int(m - r0 < kTileRows ? m - r0 : kTileRows);
    int64_t first = 0, k0 = 0, k1 = k;
    if (causal == Causal::kColumnsFrom && r0 + off > 0) first = (r0 + off) / kLanes * kLanes;
    if (causal == Causal::kTermsUpTo && r0 + rows - off < k) k1 = r0 + rows - off;
    if (causal == Causal::kTermsFrom && r0 + off > 0) k0 = r0 + off < k ? r0 + off : k;
    if (k1 < k0) k1 = k0;
    const MatA ar{a.p + r0 * a.row_stride + k0 * a.k_stride, a.row_stride, a.k_stride};
    for (int64_t c0 = first; c0 < n; c0 += kTileVecs * kLanes) {
      const int64_t left = (n - c0) / kLanes;
      const TileFn tile = pick_tile<kTileRows, kTileVecs>(rows, int(left < kTileVecs ? left : kTileVecs));
      tile(ar, MatB{b.p + k0 * b.ld + c0, b.ld}, MatC{c.p + r0 * c.ld + c0, c.ld}, k1 - k0, accumulate);
    }
  }
}


// ---------------------------------------------------------------------------------------------
// Tiles of the attention kernels (attention.cpp, and attention_ring.cpp's indexed blocks)

constexpr int64_t kQueryBlock = 64, kKeyBlock = 64;  // tile size; kQueryBlock a multiple of kLanes
constexpr int64_t kQueryVecs = kQueryBlock / kLanes;

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }
inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
inline VecF vmax(VecF a, VecF b) { return a > b ? a : b; }

// Stands in for -inf as the running maximum before any key: a query whose keys all lie in later
// tiles (document mask) then keeps m finite and exp(m_old - m_new) = 1 instead of NaN. exp_vec
// clamps its argument, so the first real key rescales by exactly what -inf gave.
constexpr float kNoScore = -1e30f;

inline float dot(const float* a, const float* b, int64_t n) {
  float sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// Hands out 64-byte aligned pieces of one thread's scratch buffer.
struct Carver {
  float* next;
  float* take(int64_t n) {
    float* p = next;
    next += round_up(n, 16);
    return p;
  }
};

// dst (D x kQueryBlock) = the n rows of src (row stride ld) transposed, other columns zero.
inline void pack_transposed(const float* src, int64_t ld, int64_t n, int64_t D, float* dst) {
  const int64_t n_full = n / kLanes * kLanes, d_full = D / kLanes * kLanes;
  for (int64_t i = 0; i < n_full; i += kLanes)
    for (int64_t d = 0; d < d_full; d += kLanes)
      transpose_block(src + i * ld + d, ld, dst + d * kQueryBlock + i, kQueryBlock);
  for (int64_t d = 0; d < D; ++d) {
    for (int64_t i = d < d_full ? n_full : 0; i < n; ++i) dst[d * kQueryBlock + i] = src[i * ld + d];
    for (int64_t i = n; i < kQueryBlock; ++i) dst[d * kQueryBlock + i] = 0.0f;
  }
}

// dst (n x Dp) = the n rows of src (row stride ld), padded with zero columns.
inline void pack_rows(const float* src, int64_t ld, int64_t n, int64_t D, int64_t Dp, float* dst) {
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(dst + i * Dp, src + i * ld, size_t(D) * sizeof(float));
    for (int64_t d = D; d < Dp; ++d) dst[i * Dp + d] = 0.0f;
  }
}

// n rows of one head (row stride ld, D columns) as a product operand: in place when rows are
// whole vectors (D == Dp), else copied into `pad` with zero columns up to Dp.
inline MatB head_rows(const float* src, int64_t ld, int64_t D, int64_t Dp, int64_t n, float* pad) {
  if (D == Dp) return {src, ld};
  pack_rows(src, ld, n, D, Dp, pad);
  return {pad, Dp};
}


// One thread's tiles of the flash forward: queries transposed, a score tile, the running output,
// max and sum, the rescale factors, and V padded to Dp columns when D is not whole vectors (`keys`
// rows of it).
struct FlashForwardWork {
  float *qt, *s, *o, *m, *l, *alpha, *v_pad;
  FlashForwardWork(float* buf, int64_t D, int64_t Dp, int64_t keys) {
    Carver c{buf};
    qt = c.take(D * kQueryBlock);
    s = c.take(kKeyBlock * kQueryBlock);
    o = c.take(kQueryBlock * Dp);
    m = c.take(kQueryBlock);
    l = c.take(kQueryBlock);
    alpha = c.take(kQueryBlock);
    v_pad = c.take(D == Dp ? 0 : keys * Dp);
  }
  static int64_t floats(int64_t D, int64_t Dp, int64_t keys) {
    return (D + kKeyBlock + Dp + 3) * kQueryBlock + (D == Dp ? 0 : keys * Dp) + 7 * 16;
  }
};

// One thread's tiles of the flash backward: Q and dO transposed and as rows, dQ of a query tile,
// the P and dS tiles, lse and D_i, padded K, and the dK, dV accumulators of `keys` rows.
struct FlashBackwardWork {
  float *qt, *dot, *q_rows, *do_rows, *dq, *s, *ds, *lse, *di, *k_pad, *dk, *dv;
  FlashBackwardWork(float* buf, int64_t D, int64_t Dp, int64_t keys) {
    Carver c{buf};
    qt = c.take(D * kQueryBlock);
    dot = c.take(D * kQueryBlock);
    q_rows = c.take(kQueryBlock * Dp);
    do_rows = c.take(kQueryBlock * Dp);
    dq = c.take(kQueryBlock * Dp);
    s = c.take(kKeyBlock * kQueryBlock);
    ds = c.take(kKeyBlock * kQueryBlock);
    lse = c.take(kQueryBlock);
    di = c.take(kQueryBlock);
    k_pad = c.take(D == Dp ? 0 : keys * Dp);
    dk = c.take(keys * Dp);
    dv = c.take(keys * Dp);
  }
  static int64_t floats(int64_t D, int64_t Dp, int64_t keys) {
    return (2 * D + 3 * Dp + 2 * kKeyBlock + 2) * kQueryBlock + (D == Dp ? 2 : 3) * keys * Dp + 12 * 16;
  }
};


// s *= scale over a transposed tile (nk keys x kQueryBlock queries), stored: what is exponentiated
// then is the rounded product the max was taken of. Left as exp(scale s - max), the compiler fuses
// it into one FMA whose unrounded product can exceed the rounded max: at scores of 1e10 by ~1e3,
// e^1e3 clamped to 3e38 per key, an infinite sum and NaN outputs where PyTorch and the decode
// kernel give finite ones (blown-up weights; tests/kernels attention `HugeScores...`).
inline void scale_tile(float* s, int64_t nk, float scale) {
  for (int64_t j = 0; j < nk; ++j)
    for (int64_t v = 0; v < kQueryVecs; ++v) {
      float* at = s + j * kQueryBlock + v * kLanes;
      store_vec(at, load_vec(at) * scale);
    }
}

// Online softmax step on a transposed score tile s (nk keys x kQueryBlock queries, unscaled).
// mask(x, v, j, fill) keeps the lanes of query vector v that see key row j and puts `fill` in the
// others. Raises the running max m, returns alpha = exp(m_old - m_new) for rescaling earlier
// outputs, updates the running sum l and turns s into the probabilities exp(scale s - m_new), 0
// where masked.
template <typename Mask>
void online_softmax(float* s, int64_t nk, float scale, float* m, float* l, float* alpha, Mask mask) {
  VecF mx[kQueryVecs], sum[kQueryVecs];
  scale_tile(s, nk, scale);
  for (int64_t v = 0; v < kQueryVecs; ++v) mx[v] = load_vec(m + v * kLanes);
  for (int64_t j = 0; j < nk; ++j)
    for (int64_t v = 0; v < kQueryVecs; ++v)
      mx[v] = vmax(mx[v], mask(load_vec(s + j * kQueryBlock + v * kLanes), v, j, -INFINITY));
  for (int64_t v = 0; v < kQueryVecs; ++v) {
    store_vec(alpha + v * kLanes, exp_vec(load_vec(m + v * kLanes) - mx[v]));
    store_vec(m + v * kLanes, mx[v]);
    sum[v] = VecF{};
  }
  for (int64_t j = 0; j < nk; ++j)
    for (int64_t v = 0; v < kQueryVecs; ++v) {
      float* sj = s + j * kQueryBlock + v * kLanes;
      const VecF p = mask(exp_vec(load_vec(sj) - mx[v]), v, j, 0.0f);
      store_vec(sj, p);
      sum[v] += p;
    }
  for (int64_t v = 0; v < kQueryVecs; ++v)
    store_vec(l + v * kLanes, load_vec(l + v * kLanes) * load_vec(alpha + v * kLanes) + sum[v]);
}

// On a transposed tile (nk keys x kQueryBlock queries) holding s = q.k (unscaled) and dp = do.v:
//   p = exp(scale s - lse_i),  ds = scale p (dp - D_i),  both 0 where `mask` (as above) hides the
// key from the query (such a key adds nothing to dv, dk or dq). s becomes p, dp becomes ds.
template <typename Mask>
void probs_and_grads(float* s, float* dp, int64_t nk, float scale, const float* lse, const float* di, Mask mask) {
  scale_tile(s, nk, scale);  // rounded as the forward rounded it (see scale_tile)
  for (int64_t j = 0; j < nk; ++j)
    for (int64_t v = 0; v < kQueryVecs; ++v) {
      const int64_t at = j * kQueryBlock + v * kLanes;
      const VecF p = mask(exp_vec(load_vec(s + at) - load_vec(lse + v * kLanes)), v, j, 0.0f);
      const VecF ds = mask(p * (load_vec(dp + at) - load_vec(di + v * kLanes)) * scale, v, j, 0.0f);
      store_vec(s + at, p);
      store_vec(dp + at, ds);
    }
}

}  // namespace
}  // namespace fab::cpu::FAB_ISA
