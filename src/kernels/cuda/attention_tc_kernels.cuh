#pragma once
// The bf16 tensor-core attention kernels of attention.cu (flash-attention-2), device code only, so
// that tests/kernels/cuda_emulation_test.cpp can compile them for the CPU with CUDA's built-ins,
// the mma among them, emulated. Include <cuda_bf16.h> (or the emulation) first.
//
// Same contract as the fp32 kernels of attention_kernels.cuh (causal GQA, the document mask
// doc_start[t] <= s <= t, out and lse written, the backward adding into dq, dk, dv), for head_dim
// 64 and 128, with the products on tensor cores: Q, K, V, P, dO and dS rounded to bf16, every
// sum (the products, the softmax statistics, D, the gradients) in fp32.
//
// Layout of the work: a block is 4 warps; a warp owns 16 rows (queries, or keys in the dk/dv
// kernel) and keeps its operand rows as mma A fragments in registers; the other operand's tile is
// staged in shared memory as bf16 pairs, converted from the fp32 inputs on load: "row pairs"
// t[r][c] = (x[r][2c], x[r][2c+1]) or the transpose's "column pairs" t[d][c] = (x[2c][d],
// x[2c+1][d]), so that every B fragment is one 32-bit read. S, P, dP, dS stay in registers: the
// C fragments of a product are re-packed as the A fragments of the next (P V, dS K, ...).
//
// Not yet run on a GPU: checked under emulation against the CPU kernels (and a bf16-rounding
// reference); tests/gpu/kernels_test.cpp checks the real thing once a GPU is available.
#include <climits>
#include <cmath>
#include <cstdint>

#include "kernels/cuda/attention_kernels.cuh"

namespace fab::cuda::attention_tc {

using attention_kernels::Args;

constexpr int kWarps = 4, kThreads = 32 * kWarps, kBlockRows = 16 * kWarps;  // 64 rows a block

// ---- bf16 fragments and the tensor-core product -------------------------------------------------

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  return uint32_t(__bfloat16_as_ushort(__float2bfloat16_rn(lo))) |
         uint32_t(__bfloat16_as_ushort(__float2bfloat16_rn(hi))) << 16;
}

// acc (16 x 8, fp32) += A (16 x 16, bf16, row-major) B (16 x 8, bf16, column-major), one warp.
// Fragments of lane = 4 group + quad (PTX ISA, mma.m16n8k16 .bf16), the element of lower k (or
// column) in the low half of each register:
//   a[0] = A[group][2quad, 2quad+1]   a[1] = A[group+8][2quad, ..]   a[2] = A[group][2quad+8, ..]
//   a[3] = A[group+8][2quad+8, ..]    b0 = B[2quad, 2quad+1][group]    b1 = B[2quad+8, ..][group]
//   acc[0], acc[1] = C[group][2quad, 2quad+1]     acc[2], acc[3] = C[group+8][2quad, 2quad+1]
__device__ __forceinline__ void mma_bf16(float (&acc)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#ifdef FAB_CUDA_EMULATION
  emulated_mma_m16n8k16_bf16(acc, a, b0, b1);
#else
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};\n"
               : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// acc[n] += A B[:, 8n .. 8n+8) for N column tiles over KS k-steps of 16, with B read from a pair
// table t[col][k / 2] = (B[k][col], B[k+1][col]): row pairs of K for Q K^T, column pairs of V for P V.
template <int N, int KS, int LD>
__device__ __forceinline__ void mma_tiles(float (&acc)[N][4], const uint32_t (&a)[KS][4], const uint32_t (*t)[LD],
                                          int lane) {
  const int group = lane / 4, quad = lane % 4;
#pragma unroll
  for (int n = 0; n < N; ++n)
#pragma unroll
    for (int kk = 0; kk < KS; ++kk) mma_bf16(acc[n], a[kk], t[n * 8 + group][kk * 8 + quad], t[n * 8 + group][kk * 8 + 4 + quad]);
}

// A fragments of the 16 x D rows src[0 .. 16) (row stride ld); rows at or past `rows` read as zero.
template <int D>
__device__ __forceinline__ void load_a_fragments(uint32_t (&a)[D / 16][4], const float* src, int64_t ld, int64_t rows,
                                                 int lane) {
  const int group = lane / 4, quad = lane % 4;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = group + 8 * (i & 1), c = kk * 16 + 2 * quad + 8 * (i >> 1);
      a[kk][i] = r < rows ? pack_bf16(src[r * ld + c], src[r * ld + c + 1]) : 0u;
    }
}

// The C fragments of a 16 x 16KS product (N = 2KS column tiles) as the A fragments of the next.
template <int KS>
__device__ __forceinline__ void c_to_a_fragments(uint32_t (&a)[KS][4], const float (&c)[2 * KS][4]) {
#pragma unroll
  for (int kk = 0; kk < KS; ++kk) {
    a[kk][0] = pack_bf16(c[2 * kk][0], c[2 * kk][1]);
    a[kk][1] = pack_bf16(c[2 * kk][2], c[2 * kk][3]);
    a[kk][2] = pack_bf16(c[2 * kk + 1][0], c[2 * kk + 1][1]);
    a[kk][3] = pack_bf16(c[2 * kk + 1][2], c[2 * kk + 1][3]);
  }
}

template <int N>
__device__ __forceinline__ void zero(float (&acc)[N][4]) {
#pragma unroll
  for (int n = 0; n < N; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
}

// ---- staging tiles in shared memory (the whole block) ------------------------------------------

// dst[r][c] = (src[r][2c], src[r][2c+1]) for the R rows of a tile, zero at and past `rows`.
template <int R, int D, int LD>
__device__ void stage_row_pairs(uint32_t (*dst)[LD], const float* src, int64_t ld, int64_t rows) {
  for (int e = threadIdx.x; e < R * D / 2; e += blockDim.x) {
    const int r = e / (D / 2), c = e % (D / 2);
    dst[r][c] = r < rows ? pack_bf16(src[r * ld + 2 * c], src[r * ld + 2 * c + 1]) : 0u;
  }
}

// dst[d][c] = (src[2c][d], src[2c+1][d]): the tile transposed, zero at and past `rows`.
template <int R, int D, int LD>
__device__ void stage_column_pairs(uint32_t (*dst)[LD], const float* src, int64_t ld, int64_t rows) {
  for (int e = threadIdx.x; e < R / 2 * D; e += blockDim.x) {
    const int c = e / D, d = e % D;
    const float lo = 2 * c < rows ? src[2 * c * ld + d] : 0.0f, hi = 2 * c + 1 < rows ? src[(2 * c + 1) * ld + d] : 0.0f;
    dst[d][c] = pack_bf16(lo, hi);
  }
}

// ---- the rows a lane holds ---------------------------------------------------------------------

// Lane (group, quad) of a warp holds rows r0 + group and r0 + group + 8 of every C fragment.
struct LaneRows {
  int64_t pos[2];  // the row's query position, -1 past the end (so every key is masked)
  int64_t doc[2];  // the first key it may see
};

__device__ inline LaneRows lane_rows(const Args& a, int64_t b, int64_t r0, int lane) {
  LaneRows rows;
  for (int half = 0; half < 2; ++half) {
    const int64_t i = r0 + lane / 4 + 8 * half;
    const bool live = i < a.tq;
    rows.pos[half] = live ? i : -1;
    rows.doc[half] = live && a.doc ? a.doc[b * a.tq + i] : 0;
  }
  return rows;
}

__device__ __forceinline__ float quad_max(float v) {  // over the 4 lanes of a group: one row of a C fragment
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}

__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

__device__ __forceinline__ int64_t warp_min(int64_t v) {
#pragma unroll
  for (int off = 16; off > 0; off /= 2) {
    const int64_t other = __shfl_xor_sync(0xffffffffu, v, off);
    v = other < v ? other : v;
  }
  return v;
}

// The first key any live row of the warp may see (INT_MAX for a warp past the end).
__device__ inline int64_t warp_first_key(const LaneRows& rows) {
  int64_t first = INT_MAX;
  for (int half = 0; half < 2; ++half)
    if (rows.pos[half] >= 0 && rows.doc[half] < first) first = rows.doc[half];
  return warp_min(first);
}

// The smallest of the 4 warps' values, for the whole block.
__device__ inline int64_t block_min(int64_t warp_value) {
  __shared__ int64_t values[kWarps];
  if (threadIdx.x % 32 == 0) values[threadIdx.x / 32] = warp_value;
  __syncthreads();
  int64_t smallest = values[0];
  for (int w = 1; w < kWarps; ++w) smallest = values[w] < smallest ? values[w] : smallest;
  __syncthreads();
  return smallest;
}

// S's element e of column tile n at keys j0..: scale s where row `half` may see the key, else -inf.
template <int N>
__device__ __forceinline__ void mask_scores(float (&s)[N][4], const LaneRows& rows, int64_t j0, float scale, int lane) {
#pragma unroll
  for (int n = 0; n < N; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int64_t key = j0 + n * 8 + 2 * (lane % 4) + (e & 1), pos = rows.pos[e >> 1];
      s[n][e] = key <= pos && key >= rows.doc[e >> 1] ? s[n][e] * scale : -INFINITY;
    }
}

// Adds the C fragments acc * factor into the 16 rows dst[0 ..) (stride ld) below `rows`.
template <int N>
__device__ __forceinline__ void add_rows(float* dst, int64_t ld, int64_t rows, const float (&acc)[N][4], float factor,
                                         int lane) {
#pragma unroll
  for (int n = 0; n < N; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = lane / 4 + 8 * (e >> 1), c = n * 8 + 2 * (lane % 4) + (e & 1);
      if (r < rows) dst[r * ld + c] += acc[n][e] * factor;
    }
}

// ---- forward ------------------------------------------------------------------------------------

// One block: 64 query rows of head h (blockIdx.y) in batch b (blockIdx.z); warp w the rows
// 16w ... For each tile of 64 keys: S = scale Q K^T (masked to -inf), the online softmax
// m' = max(m, rowmax S), l' = e^(m - m') l + rowsum P with P = e^(S - m'), O' = e^(m - m') O + P V.
// At the end out = O / l, lse = m + log l. A warp skips the tiles none of its rows may see.
template <int D>
__global__ void __launch_bounds__(kThreads) forward_kernel(Args a) {
  constexpr int kKeys = 64, LD = D / 2 + 4, LK = kKeys / 2 + 4, NS = kKeys / 8, NO = D / 8;
  __shared__ uint32_t ks[kKeys][LD], vt[D][LK];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t b = blockIdx.z, h = blockIdx.y, q0 = int64_t(blockIdx.x) * kBlockRows, r0 = q0 + 16 * warp;
  const int64_t g = h / (a.heads / a.kv_heads), q_row = a.heads * D, kv_row = a.kv_heads * D;
  const LaneRows rows = lane_rows(a, b, r0, lane);
  uint32_t qa[D / 16][4];
  load_a_fragments<D>(qa, a.q + (b * a.tq + r0) * q_row + h * D, q_row, a.tq - r0, lane);
  const int64_t warp_first = warp_first_key(rows), warp_last = (r0 + 15 < a.tq ? r0 + 15 : a.tq - 1);
  const int64_t first_key = block_min(warp_first) / kKeys * kKeys, end_key = q0 + kBlockRows < a.tq ? q0 + kBlockRows : a.tq;
  const float* kb = a.k + b * a.kv_stride * kv_row + g * D;
  const float* vb = a.v + b * a.kv_stride * kv_row + g * D;
  float o[NO][4], m[2] = {-1e30f, -1e30f}, l[2] = {0.0f, 0.0f};  // finite m: a fully masked tile stays NaN-free
  zero(o);
  for (int64_t j0 = first_key; j0 < end_key; j0 += kKeys) {
    __syncthreads();  // the previous tile is fully read
    stage_row_pairs<kKeys, D, LD>(ks, kb + j0 * kv_row, kv_row, a.tq - j0);
    stage_column_pairs<kKeys, D, LK>(vt, vb + j0 * kv_row, kv_row, a.tq - j0);
    __syncthreads();
    if (j0 > warp_last || j0 + kKeys <= warp_first) continue;  // warp-uniform
    float s[NS][4];
    zero(s);
    mma_tiles<NS, D / 16, LD>(s, qa, ks, lane);
    mask_scores(s, rows, j0, a.scale, lane);
    float m_new[2], alpha[2];
    for (int half = 0; half < 2; ++half) {
      float tile_max = -INFINITY;
#pragma unroll
      for (int n = 0; n < NS; ++n) tile_max = fmaxf(tile_max, fmaxf(s[n][2 * half], s[n][2 * half + 1]));
      m_new[half] = fmaxf(m[half], quad_max(tile_max));
      alpha[half] = expf(m[half] - m_new[half]);
      l[half] *= alpha[half];
      m[half] = m_new[half];
    }
#pragma unroll
    for (int n = 0; n < NS; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[n][e] = expf(s[n][e] - m_new[e >> 1]);  // P, in fp32 for l and rounded to bf16 for P V
        l[e >> 1] += s[n][e];
      }
#pragma unroll
    for (int n = 0; n < NO; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[n][e] *= alpha[e >> 1];
    uint32_t pa[kKeys / 16][4];
    c_to_a_fragments<kKeys / 16>(pa, s);
    mma_tiles<NO, kKeys / 16, LK>(o, pa, vt, lane);
  }
  const float l_row[2] = {quad_sum(l[0]), quad_sum(l[1])};
#pragma unroll
  for (int n = 0; n < NO; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int half = e >> 1;
      if (rows.pos[half] < 0) continue;
      const int64_t i = rows.pos[half];
      a.o_write[(b * a.tq + i) * q_row + h * D + n * 8 + 2 * (lane % 4) + (e & 1)] = o[n][e] / l_row[half];
    }
  if (a.lse_write && lane % 4 == 0)
    for (int half = 0; half < 2; ++half)
      if (rows.pos[half] >= 0) a.lse_write[(b * a.heads + h) * a.tq + rows.pos[half]] = m[half] + logf(l_row[half]);
}

// ---- backward -----------------------------------------------------------------------------------
// With S = Q K^T (masked), P = softmax(scale S) = e^(scale S - lse), O = P V and dO given:
//   dV = P^T dO;   dP = dO V^T;   dS = P * (dP - D), D_i = sum_j P_ij dP_ij = dO_i . O_i;
//   dQ = scale dS K;   dK = scale dS^T Q.
// row_dot_kernel writes D; dq_kernel walks key tiles for 64 query rows (dQ), dkdv_kernel query
// tiles for 64 keys (dK, dV, summed over the group's query heads). Each block owns the rows it
// adds into: no atomics.

// D of row r = (b * T + i) * heads + h: one warp a row. dvec is (B, H, T).
__global__ void __launch_bounds__(kThreads) row_dot_kernel(Args a, int64_t n_rows) {
  const int64_t r = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (r >= n_rows) return;  // warp-uniform
  const int lane = threadIdx.x % 32;
  float sum = 0.0f;
  for (int64_t d = lane; d < a.d; d += 32) sum += a.dout[r * a.d + d] * a.out[r * a.d + d];
#pragma unroll
  for (int off = 16; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  const int64_t h = r % a.heads, i = r / a.heads % a.tq, b = r / (a.heads * a.tq);
  if (lane == 0) a.dvec[(b * a.heads + h) * a.tq + i] = sum;
}

// One block: 64 query rows of head h; per tile of keys, S = Q K^T and dP = dO V^T (mma), then
// P = e^(scale S - lse) and dS = P (dP - D) in fp32, dQ += dS K (mma); dq += scale dQ at the end.
// 32-key tiles at head_dim 128 keep the three staged tiles within 48 KiB of shared memory.
template <int D>
__global__ void __launch_bounds__(kThreads) dq_kernel(Args a) {
  constexpr int kKeys = D == 128 ? 32 : 64, LD = D / 2 + 4, LK = kKeys / 2 + 4, NS = kKeys / 8, NO = D / 8;
  __shared__ uint32_t ks[kKeys][LD], vs[kKeys][LD], kt[D][LK];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t b = blockIdx.z, h = blockIdx.y, q0 = int64_t(blockIdx.x) * kBlockRows, r0 = q0 + 16 * warp;
  const int64_t g = h / (a.heads / a.kv_heads), q_row = a.heads * D, kv_row = a.kv_heads * D;
  const LaneRows rows = lane_rows(a, b, r0, lane);
  const int64_t at = (b * a.tq + r0) * q_row + h * D;
  uint32_t qa[D / 16][4], da[D / 16][4];
  load_a_fragments<D>(qa, a.q + at, q_row, a.tq - r0, lane);
  load_a_fragments<D>(da, a.dout + at, q_row, a.tq - r0, lane);
  float lse[2], dvec[2];
  for (int half = 0; half < 2; ++half) {
    const int64_t stat = (b * a.heads + h) * a.tq + rows.pos[half];
    lse[half] = rows.pos[half] >= 0 ? a.lse[stat] : 0.0f;
    dvec[half] = rows.pos[half] >= 0 ? a.dvec[stat] : 0.0f;
  }
  const int64_t warp_first = warp_first_key(rows), warp_last = (r0 + 15 < a.tq ? r0 + 15 : a.tq - 1);
  const int64_t first_key = block_min(warp_first) / kKeys * kKeys, end_key = q0 + kBlockRows < a.tq ? q0 + kBlockRows : a.tq;
  const float* kb = a.k + b * a.kv_stride * kv_row + g * D;
  const float* vb = a.v + b * a.kv_stride * kv_row + g * D;
  float dq[NO][4];
  zero(dq);
  for (int64_t j0 = first_key; j0 < end_key; j0 += kKeys) {
    __syncthreads();
    stage_row_pairs<kKeys, D, LD>(ks, kb + j0 * kv_row, kv_row, a.tq - j0);
    stage_row_pairs<kKeys, D, LD>(vs, vb + j0 * kv_row, kv_row, a.tq - j0);
    stage_column_pairs<kKeys, D, LK>(kt, kb + j0 * kv_row, kv_row, a.tq - j0);
    __syncthreads();
    if (j0 > warp_last || j0 + kKeys <= warp_first) continue;
    float s[NS][4], dp[NS][4];
    zero(s), zero(dp);
    mma_tiles<NS, D / 16, LD>(s, qa, ks, lane);
    mma_tiles<NS, D / 16, LD>(dp, da, vs, lane);
    mask_scores(s, rows, j0, a.scale, lane);
#pragma unroll
    for (int n = 0; n < NS; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] = expf(s[n][e] - lse[e >> 1]) * (dp[n][e] - dvec[e >> 1]);  // dS
    uint32_t dsa[kKeys / 16][4];
    c_to_a_fragments<kKeys / 16>(dsa, s);
    mma_tiles<NO, kKeys / 16, LK>(dq, dsa, kt, lane);
  }
  add_rows(a.dq + at, q_row, a.tq - r0, dq, a.scale, lane);
}

// One block: 64 keys of kv head g (blockIdx.y), warp w the keys 16w ..; for each query head of the
// group and each query tile at or after the keys: S^T = K Q^T and dP^T = V dO^T (mma), P^T and
// dS^T in fp32, then dV += P^T dO and dK += dS^T Q (mma). A query tile whose documents all start
// after the block's keys is not staged (packed rows: the later documents' tiles cost their
// statistics' reads only). 32-query tiles at head_dim 128 keep the four staged tiles within 48 KiB
// of shared memory.
template <int D>
__global__ void __launch_bounds__(kThreads) dkdv_kernel(Args a) {
  constexpr int kQueries = D == 128 ? 32 : 64, LD = D / 2 + 4, LQ = kQueries / 2 + 4, NS = kQueries / 8, NO = D / 8;
  __shared__ uint32_t qs[kQueries][LD], dos[kQueries][LD], qt[D][LQ], dot[D][LQ];
  __shared__ float lse_s[kQueries], dvec_s[kQueries];
  __shared__ int64_t doc_s[kQueries];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, group = lane / 4, quad = lane % 4;
  const int64_t b = blockIdx.z, g = blockIdx.y, j0 = int64_t(blockIdx.x) * kBlockRows, k0 = j0 + 16 * warp;
  const int64_t heads_per_kv = a.heads / a.kv_heads, q_row = a.heads * D, kv_row = a.kv_heads * D;
  const int64_t at = (b * a.kv_stride + k0) * kv_row + g * D;
  uint32_t ka[D / 16][4], va[D / 16][4];
  load_a_fragments<D>(ka, a.k + at, kv_row, a.tq - k0, lane);
  load_a_fragments<D>(va, a.v + at, kv_row, a.tq - k0, lane);
  const int64_t key_last = k0 + 15 < a.tq ? k0 + 15 : a.tq - 1;
  const int64_t block_key_last = j0 + kBlockRows - 1 < a.tq ? j0 + kBlockRows - 1 : a.tq - 1;
  float dk[NO][4], dv[NO][4];
  zero(dk), zero(dv);
  for (int64_t h = g * heads_per_kv; h < (g + 1) * heads_per_kv; ++h) {
    for (int64_t t0 = j0 / kQueries * kQueries; t0 < a.tq; t0 += kQueries) {
      const int64_t nq = a.tq - t0 < kQueries ? a.tq - t0 : kQueries, at_q = (b * a.tq + t0) * q_row + h * D;
      __syncthreads();  // the previous tile is fully read
      for (int e = threadIdx.x; e < kQueries; e += blockDim.x) {
        const int64_t stat = (b * a.heads + h) * a.tq + t0 + e;
        lse_s[e] = e < nq ? a.lse[stat] : 0.0f;
        dvec_s[e] = e < nq ? a.dvec[stat] : 0.0f;
        doc_s[e] = e >= nq ? INT_MAX : a.doc ? a.doc[b * a.tq + t0 + e] : 0;  // INT_MAX past the end: masked
      }
      __syncthreads();
      const int64_t tile_first_doc = warp_min(doc_s[lane] < doc_s[lane + kQueries - 32] ? doc_s[lane] : doc_s[lane + kQueries - 32]);
      if (tile_first_doc > block_key_last) continue;  // block-uniform: every query's document starts later
      stage_row_pairs<kQueries, D, LD>(qs, a.q + at_q, q_row, nq);
      stage_row_pairs<kQueries, D, LD>(dos, a.dout + at_q, q_row, nq);
      stage_column_pairs<kQueries, D, LQ>(qt, a.q + at_q, q_row, nq);
      stage_column_pairs<kQueries, D, LQ>(dot, a.dout + at_q, q_row, nq);
      __syncthreads();
      if (k0 > key_last || t0 + nq - 1 < k0 || tile_first_doc > key_last) continue;  // no key of the warp is seen
      float s[NS][4], dp[NS][4];
      zero(s), zero(dp);
      mma_tiles<NS, D / 16, LD>(s, ka, qs, lane);
      mma_tiles<NS, D / 16, LD>(dp, va, dos, lane);
#pragma unroll
      for (int n = 0; n < NS; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int qi = n * 8 + 2 * quad + (e & 1);
          const int64_t key = k0 + group + 8 * (e >> 1), query = t0 + qi;
          const bool seen = key < a.tq && key <= query && key >= doc_s[qi];  // doc_s: INT_MAX past the end
          const float p = seen ? expf(s[n][e] * a.scale - lse_s[qi]) : 0.0f;
          s[n][e] = p;
          dp[n][e] = p * (dp[n][e] - dvec_s[qi]);  // dS^T
        }
      uint32_t pa[kQueries / 16][4], dsa[kQueries / 16][4];
      c_to_a_fragments<kQueries / 16>(pa, s);
      c_to_a_fragments<kQueries / 16>(dsa, dp);
      mma_tiles<NO, kQueries / 16, LQ>(dv, pa, dot, lane);
      mma_tiles<NO, kQueries / 16, LQ>(dk, dsa, qt, lane);
    }
  }
  add_rows(a.dk + at, kv_row, a.tq - k0, dk, a.scale, lane);
  add_rows(a.dv + at, kv_row, a.tq - k0, dv, 1.0f, lane);
}

}  // namespace fab::cuda::attention_tc
