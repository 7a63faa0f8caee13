#pragma once
// The attention kernels of attention.cu, in a header of their own so that
// tests/kernels/cuda_emulation_test.cpp can compile them for the CPU with CUDA's few built-ins
// emulated (threads, barriers, shuffles) and check their indexing and masking against the CPU
// kernels where no GPU exists. Device code only: the launches live in attention.cu.
//
// Causal grouped-query attention in fp32 on CUDA cores, the flash-attention recipe: no (T, T)
// matrix; the forward keeps the output and each row's log-sum-exp, the backward recomputes the
// probabilities. Same contract as kernels/cpu/attention.cpp (the reference), including the
// document mask of packed rows (query t sees keys doc_start[t] <= s <= t).
//
// Layout of the work: P consecutive threads own one row (a query, or a key in the dk/dv kernel)
// and split its head_dim interleaved (thread `part` holds dims part, part + P, ...), so a row's
// dot products are P-lane shuffle sums, and a tile of the other operand is staged in shared
// memory and read as broadcasts. head_dim up to 128 (Llama, Qwen, Mistral); larger fails clearly.
//
// Not yet run on a GPU: checked against the CPU kernels by tests/gpu/ once a GPU is available.
// These kernels compute in fp32; attention.cu takes the bf16 tensor-core kernels of
// attention_tc_kernels.cuh instead when the shape allows bf16 compute and head_dim is 64 or 128.
#include <climits>
#include <cstdint>

namespace fab::cuda::attention_kernels {

constexpr int kThreads = 256;

template <int P>
__device__ __forceinline__ float group_sum(float v) {
#pragma unroll
  for (int off = P / 2; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// dst[r][c] = src[r * ld + c] for r < rows and c < d, else 0 (whole block cooperates).
template <int R, int W>
__device__ void stage(float (*dst)[W], const float* src, int64_t ld, int64_t rows, int64_t d) {
  for (int e = threadIdx.x; e < R * W; e += blockDim.x) {
    const int r = e / W, c = e % W;
    dst[r][c] = r < rows && c < d ? src[r * ld + c] : 0.0f;
  }
}

struct Args {
  const float *q, *k, *v, *out, *lse, *dout;
  float *o_write, *lse_write, *dq, *dk, *dv, *dvec;  // dvec: D_i = dout_i . out_i, (B, H, Tq)
  const int32_t* doc;                                // (B, Tq) or nullptr
  int64_t tq, kv_stride, heads, kv_heads, d, pos0;  // keys of batch b at rows b * kv_stride ...
  float scale;
};

// The first key any row of the query block [q0, q0 + rows) may see: the smallest document start.
__device__ inline int64_t first_key_of_block(const Args& a, int64_t b, int64_t i, bool live, int part) {
  __shared__ int smallest;
  if (threadIdx.x == 0) smallest = INT_MAX;
  __syncthreads();
  if (part == 0 && live) atomicMin(&smallest, a.doc ? a.doc[b * a.tq + i] : 0);
  __syncthreads();
  return smallest;
}

// One block: 64 query rows of head h (blockIdx.y) in batch b (blockIdx.z). For each tile of 32
// keys: s = scale q.k (masked to -inf), online softmax m, l; o = alpha o + sum_j p_j v_j.
template <int DT>
__global__ void __launch_bounds__(kThreads) forward_kernel(Args a) {
  constexpr int P = 4, W = P * DT, kRows = kThreads / P, kKeys = 32;
  __shared__ float ks[kKeys][W], vs[kKeys][W];
  const int part = threadIdx.x % P, row = threadIdx.x / P;
  const int64_t b = blockIdx.z, h = blockIdx.y, q0 = int64_t(blockIdx.x) * kRows, i = q0 + row;
  const bool live = i < a.tq;
  const int64_t g = h / (a.heads / a.kv_heads), q_row = a.heads * a.d, kv_row = a.kv_heads * a.d;
  const int64_t pos = a.pos0 + (live ? i : a.tq - 1);
  const int64_t doc = a.doc && live ? a.doc[b * a.tq + i] : 0;
  const int64_t first_key = first_key_of_block(a, b, i, live, part) / kKeys * kKeys;
  const int64_t end_key = a.pos0 + (q0 + kRows < a.tq ? q0 + kRows : a.tq);
  float qr[DT], o[DT];
  const float* qp = a.q + (b * a.tq + (live ? i : 0)) * q_row + h * a.d;
#pragma unroll
  for (int m = 0; m < DT; ++m) {
    const int dd = part + P * m;
    qr[m] = live && dd < a.d ? qp[dd] : 0.0f;
    o[m] = 0.0f;
  }
  const float* kb = a.k + b * a.kv_stride * kv_row + g * a.d;
  const float* vb = a.v + b * a.kv_stride * kv_row + g * a.d;
  float m_run = -1e30f, l_run = 0.0f;  // finite start: a row whose keys all lie in later tiles stays NaN-free
  for (int64_t j0 = first_key; j0 < end_key; j0 += kKeys) {
    const int64_t nk = end_key - j0 < kKeys ? end_key - j0 : kKeys;
    __syncthreads();  // the previous tile is fully read
    stage<kKeys, W>(ks, kb + j0 * kv_row, kv_row, nk, a.d);
    stage<kKeys, W>(vs, vb + j0 * kv_row, kv_row, nk, a.d);
    __syncthreads();
    float s[kKeys], tile_max = -INFINITY;
#pragma unroll
    for (int j = 0; j < kKeys; ++j) {
      float partial = 0.0f;
#pragma unroll
      for (int m = 0; m < DT; ++m) partial += qr[m] * ks[j][part + P * m];
      const float sc = group_sum<P>(partial) * a.scale;
      const int64_t key = j0 + j;
      s[j] = j < nk && key <= pos && key >= doc ? sc : -INFINITY;
      tile_max = fmaxf(tile_max, s[j]);
    }
    const float m_new = fmaxf(m_run, tile_max), alpha = expf(m_run - m_new);
    float psum = 0.0f;
#pragma unroll
    for (int m = 0; m < DT; ++m) o[m] *= alpha;
#pragma unroll
    for (int j = 0; j < kKeys; ++j) {
      const float p = expf(s[j] - m_new);
      psum += p;
#pragma unroll
      for (int m = 0; m < DT; ++m) o[m] += p * vs[j][part + P * m];
    }
    l_run = l_run * alpha + psum;
    m_run = m_new;
  }
  if (!live) return;
  float* op = a.o_write + (b * a.tq + i) * q_row + h * a.d;
  const float inv = 1.0f / l_run;
#pragma unroll
  for (int m = 0; m < DT; ++m)
    if (part + P * m < a.d) op[part + P * m] = o[m] * inv;
  if (a.lse_write && part == 0) a.lse_write[(b * a.heads + h) * a.tq + i] = m_run + logf(l_run);
}

// Backward, with O = P V, P = softmax(scale S), S = Q K^T (masked):
//   dV = P^T dO;  dP = dO V^T;  dS = P * (dP - D) with D_i = sum_j P_ij dP_ij = dO_i . O_i;
//   dQ = scale dS K;  dK = scale dS^T Q.
// dq_kernel: one block per 64 query rows of a head; walks the key tiles, dq += scale dS K, and
// writes D_i for dkdv_kernel.
template <int DT>
__global__ void __launch_bounds__(kThreads) dq_kernel(Args a) {
  constexpr int P = 4, W = P * DT, kRows = kThreads / P, kKeys = 32;
  __shared__ float ks[kKeys][W], vs[kKeys][W];
  const int part = threadIdx.x % P, row = threadIdx.x / P;
  const int64_t b = blockIdx.z, h = blockIdx.y, q0 = int64_t(blockIdx.x) * kRows, i = q0 + row;
  const bool live = i < a.tq;
  const int64_t g = h / (a.heads / a.kv_heads), q_row = a.heads * a.d, kv_row = a.kv_heads * a.d;
  const int64_t pos = live ? i : a.tq - 1;
  const int64_t doc = a.doc && live ? a.doc[b * a.tq + i] : 0;
  const int64_t first_key = first_key_of_block(a, b, i, live, part) / kKeys * kKeys;
  const int64_t end_key = q0 + kRows < a.tq ? q0 + kRows : a.tq;
  const int64_t at = (b * a.tq + (live ? i : 0)) * q_row + h * a.d;
  float qr[DT], dor[DT], acc[DT], d_partial = 0.0f;
#pragma unroll
  for (int m = 0; m < DT; ++m) {
    const int dd = part + P * m;
    const bool in = live && dd < a.d;
    qr[m] = in ? a.q[at + dd] : 0.0f;
    dor[m] = in ? a.dout[at + dd] : 0.0f;
    d_partial += in ? dor[m] * a.out[at + dd] : 0.0f;
    acc[m] = 0.0f;
  }
  const float d_i = group_sum<P>(d_partial);
  const int64_t stat = (b * a.heads + h) * a.tq + i;
  const float lse_i = live ? a.lse[stat] : 0.0f;
  if (live && part == 0) a.dvec[stat] = d_i;
  const float* kb = a.k + b * a.kv_stride * kv_row + g * a.d;
  const float* vb = a.v + b * a.kv_stride * kv_row + g * a.d;
  for (int64_t j0 = first_key; j0 < end_key; j0 += kKeys) {
    const int64_t nk = end_key - j0 < kKeys ? end_key - j0 : kKeys;
    __syncthreads();
    stage<kKeys, W>(ks, kb + j0 * kv_row, kv_row, nk, a.d);
    stage<kKeys, W>(vs, vb + j0 * kv_row, kv_row, nk, a.d);
    __syncthreads();
#pragma unroll 4
    for (int j = 0; j < kKeys; ++j) {
      float ps = 0.0f, pd = 0.0f;
#pragma unroll
      for (int m = 0; m < DT; ++m) {
        ps += qr[m] * ks[j][part + P * m];
        pd += dor[m] * vs[j][part + P * m];
      }
      const float s = group_sum<P>(ps) * a.scale, dp = group_sum<P>(pd);
      const int64_t key = j0 + j;
      const bool valid = live && j < nk && key <= pos && key >= doc;
      const float p = valid ? expf(s - lse_i) : 0.0f, ds = p * (dp - d_i) * a.scale;
#pragma unroll
      for (int m = 0; m < DT; ++m) acc[m] += ds * ks[j][part + P * m];
    }
  }
  if (!live) return;
#pragma unroll
  for (int m = 0; m < DT; ++m)
    if (part + P * m < a.d) a.dq[at + part + P * m] += acc[m];
}

// dkdv_kernel: one block per 32 keys of kv head g (blockIdx.y); walks every query head of the
// group and every query tile at or after the keys (causal), dv += P^T dO, dk += scale dS^T Q.
// Each block owns its dk/dv rows: no atomics.
template <int DT>
__global__ void __launch_bounds__(kThreads) dkdv_kernel(Args a) {
  constexpr int P = 8, W = P * DT, kKeyRows = kThreads / P, kQueries = 32;
  __shared__ float qs[kQueries][W], dos[kQueries][W];
  __shared__ float lse_s[kQueries], dvec_s[kQueries];
  __shared__ int doc_s[kQueries];
  const int part = threadIdx.x % P, row = threadIdx.x / P;
  const int64_t b = blockIdx.z, g = blockIdx.y, j0 = int64_t(blockIdx.x) * kKeyRows, key = j0 + row;
  const bool live = key < a.tq;
  const int64_t group = a.heads / a.kv_heads, q_row = a.heads * a.d, kv_row = a.kv_heads * a.d;
  const int64_t at = (b * a.kv_stride + (live ? key : 0)) * kv_row + g * a.d;
  float kr[DT], vr[DT], dk[DT], dv[DT];
#pragma unroll
  for (int m = 0; m < DT; ++m) {
    const int dd = part + P * m;
    kr[m] = live && dd < a.d ? a.k[at + dd] : 0.0f;
    vr[m] = live && dd < a.d ? a.v[at + dd] : 0.0f;
    dk[m] = dv[m] = 0.0f;
  }
  for (int64_t h = g * group; h < (g + 1) * group; ++h) {
    for (int64_t t0 = j0 / kQueries * kQueries; t0 < a.tq; t0 += kQueries) {
      const int64_t nq = a.tq - t0 < kQueries ? a.tq - t0 : kQueries;
      __syncthreads();
      stage<kQueries, W>(qs, a.q + (b * a.tq + t0) * q_row + h * a.d, q_row, nq, a.d);
      stage<kQueries, W>(dos, a.dout + (b * a.tq + t0) * q_row + h * a.d, q_row, nq, a.d);
      for (int e = threadIdx.x; e < kQueries; e += blockDim.x) {
        const int64_t stat = (b * a.heads + h) * a.tq + t0 + e;
        lse_s[e] = e < nq ? a.lse[stat] : 0.0f;
        dvec_s[e] = e < nq ? a.dvec[stat] : 0.0f;
        doc_s[e] = e >= nq ? INT_MAX : a.doc ? a.doc[b * a.tq + t0 + e] : 0;
      }
      __syncthreads();
#pragma unroll 4
      for (int q = 0; q < kQueries; ++q) {
        float ps = 0.0f, pd = 0.0f;
#pragma unroll
        for (int m = 0; m < DT; ++m) {
          ps += kr[m] * qs[q][part + P * m];
          pd += vr[m] * dos[q][part + P * m];
        }
        const float s = group_sum<P>(ps) * a.scale, dp = group_sum<P>(pd);
        const bool valid = live && key <= t0 + q && key >= doc_s[q];  // doc_s is INT_MAX past the end
        const float p = valid ? expf(s - lse_s[q]) : 0.0f, ds = p * (dp - dvec_s[q]) * a.scale;
#pragma unroll
        for (int m = 0; m < DT; ++m) {
          dv[m] += p * dos[q][part + P * m];
          dk[m] += ds * qs[q][part + P * m];
        }
      }
    }
  }
  if (!live) return;
#pragma unroll
  for (int m = 0; m < DT; ++m)
    if (part + P * m < a.d) {
      a.dk[at + part + P * m] += dk[m];
      a.dv[at + part + P * m] += dv[m];
    }
}

}  // namespace fab::cuda::attention_kernels
