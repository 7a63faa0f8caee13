// The generation kernels of the KernelTable: decode_matmul and sampling_weights (kernels/kernel_table.h).
//
// The GEMM of a decode step: C (M, N) (+)= A (M, K) x B^T with B stored (N, K) (a weight, as the
// forward pass has it), M small (the rows of a step's slots), A and B both f32 or both bf16 with
// fp32 accumulation. Unlike oneDNN's primitive it holds no lock and keeps no shared buffer, so
// each thread of the rollout engine runs its own slots' GEMMs at once inside one parallel region;
// called outside a parallel region it splits the columns over the threads itself.
//
// Every output is the same sum in the same order whatever M, the row block it falls in, or how
// the columns are split: per K-vector lanes accumulated with FMA, the lanes added by a fixed
// halving tree, then the K remainder. So a slot's logits do not depend on its batch.
//
// Vectors are GCC vector extensions (vec_ext.h).
#include <immintrin.h>
#include <omp.h>

#include "kernels/cpu/isa_kernels.h"
#include "kernels/cpu/vec_ext.h"
#include "kernels/cpu/vec_math.h"

namespace fab::cpu::FAB_ISA {
namespace {

#ifdef __AVX512F__
constexpr int kColumnBlock = 4;  // 4 x 4 accumulators + 4 B vectors + 1 A vector of 32 registers
#else
constexpr int kColumnBlock = 2;  // 4 x 2 + 2 + 1 of 16 registers
#endif
constexpr int kRowBlock = 4;

inline float widen(float x) { return x; }
inline float widen(uint16_t x) { return std::bit_cast<float>(uint32_t(x) << 16); }

// Each output: its lanes' sum, the K remainder, then into C. Inlined, so the accumulators stay in
// registers (as an out-of-line argument they were zeroed on the stack by a rep stos per block).
template <int Rows, int Cols, typename T>
[[gnu::always_inline]] inline void finish(const Floats (&acc)[Rows][Cols], const T* a, const T* b, int64_t p, int64_t k, float* c, int64_t ldc,
            bool accumulate) {
  for (int i = 0; i < Rows; ++i)
    for (int j = 0; j < Cols; ++j) {
      float sum = lane_sum(acc[i][j]);
      for (int64_t q = p; q < k; ++q) sum += widen(a[i * k + q]) * widen(b[j * k + q]);
      float& out = c[i * ldc + j];
      out = accumulate ? out + sum : sum;
    }
}

// The next block of B's rows (they follow this block's), one cache line per row and K step:
// streams of a few KB are too short for the hardware prefetcher, and the weights come from L3.
template <int Cols, typename T>
inline void prefetch_next(const T* b, int64_t k, int64_t p) {
  for (int j = 0; j < Cols; ++j) __builtin_prefetch(b + (Cols + j) * k + p);
}

// C[rows x cols block] (+)= A[rows] . B[cols] over K: one FMA per lane and K element.
template <int Rows, int Cols, typename T>
void block(const T* a, const T* b, int64_t k, float* c, int64_t ldc, bool accumulate) {
  Floats acc[Rows][Cols];
  for (int i = 0; i < Rows; ++i)
    for (int j = 0; j < Cols; ++j) acc[i][j] = Floats{};
  int64_t p = 0;
  for (; p + kLanes <= k; p += kLanes) {
    prefetch_next<Cols>(b, k, p);
    Floats bv[Cols];
    for (int j = 0; j < Cols; ++j) bv[j] = load(b + j * k + p);
    for (int i = 0; i < Rows; ++i) {
      const Floats av = load(a + i * k + p);
      for (int j = 0; j < Cols; ++j) acc[i][j] += av * bv[j];
    }
  }
  finish(acc, a, b, p, k, c, ldc, accumulate);
}

#ifdef __AVX512F__
// bf16 on CPUs with AVX512-BF16 (Zen 4, Cooper Lake, Sapphire Rapids): vdpbf16ps adds two exact
// bf16 products per lane and instruction, twice the widening FMA's rate.
bool has_bf16_dot() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512bf16");
  }();
  return has;
}

template <int Rows, int Cols>
__attribute__((target("avx512bf16"))) void block_dot(const uint16_t* a, const uint16_t* b, int64_t k, float* c,
                                                     int64_t ldc, bool accumulate) {
  Floats acc[Rows][Cols];
  for (int i = 0; i < Rows; ++i)
    for (int j = 0; j < Cols; ++j) acc[i][j] = Floats{};
  int64_t p = 0;
  for (; p + 2 * kLanes <= k; p += 2 * kLanes) {
    prefetch_next<Cols>(b, k, p);
    __m512bh bv[Cols];
    for (int j = 0; j < Cols; ++j) bv[j] = (__m512bh)_mm512_loadu_si512(b + j * k + p);
    for (int i = 0; i < Rows; ++i) {
      const __m512bh av = (__m512bh)_mm512_loadu_si512(a + i * k + p);
      for (int j = 0; j < Cols; ++j) acc[i][j] = Floats(_mm512_dpbf16_ps(__m512(acc[i][j]), av, bv[j]));
    }
  }
  finish(acc, a, b, p, k, c, ldc, accumulate);
}
#endif

template <int Rows, int Cols, bool Dot, typename T>
void tile(const T* a, const T* b, int64_t k, float* c, int64_t ldc, bool accumulate) {
#ifdef __AVX512F__
  if constexpr (Dot) return block_dot<Rows, Cols>(a, b, k, c, ldc, accumulate);
#endif
  block<Rows, Cols>(a, b, k, c, ldc, accumulate);
}

// One block of columns of every row, row blocks of kRowBlock (the rest one block of fewer rows).
template <int Cols, bool Dot, typename T>
void column_block(const T* a, const T* b, int64_t m, int64_t k, float* c, int64_t ldc, bool accumulate) {
  int64_t i = 0;
  for (; i + kRowBlock <= m; i += kRowBlock) tile<kRowBlock, Cols, Dot>(a + i * k, b, k, c + i * ldc, ldc, accumulate);
  switch (m - i) {
    case 3: tile<3, Cols, Dot>(a + i * k, b, k, c + i * ldc, ldc, accumulate); break;
    case 2: tile<2, Cols, Dot>(a + i * k, b, k, c + i * ldc, ldc, accumulate); break;
    case 1: tile<1, Cols, Dot>(a + i * k, b, k, c + i * ldc, ldc, accumulate); break;
    default: break;
  }
}

template <bool Dot, typename T>
void run(const T* a, const T* b, const MatmulArgs& x) {
  const int64_t blocks = (x.n + kColumnBlock - 1) / kColumnBlock;
  // B's block of columns stays in L1 while every row block reads it.
#pragma omp parallel for schedule(static)
  for (int64_t nb = 0; nb < blocks; ++nb) {
    const int64_t n0 = nb * kColumnBlock;
    if (n0 + kColumnBlock <= x.n) {
      column_block<kColumnBlock, Dot>(a, b + n0 * x.k, x.m, x.k, x.c + n0, x.n, x.accumulate);
    } else {
      for (int64_t j = n0; j < x.n; ++j) column_block<1, Dot>(a, b + j * x.k, x.m, x.k, x.c + j, x.n, x.accumulate);
    }
  }
}

}  // namespace

// The caller checks the layout (nn/op_helpers.h gemm): no error path here, whose inline helpers the
// two ISA builds would share.
void decode_matmul(const MatmulArgs& x) {
  if (x.dtype != DType::bf16) return run<false>(static_cast<const float*>(x.a), static_cast<const float*>(x.b), x);
  const auto* a = static_cast<const uint16_t*>(x.a);
  const auto* b = static_cast<const uint16_t*>(x.b);
#ifdef __AVX512F__
  if (has_bf16_dot()) return run<true>(a, b, x);
#endif
  run<false>(a, b, x);
}

// The max, then weight_i = exp((logit_i - max) t) (exp_approx: ~1 ulp) and their sum in double,
// vectorised: sampling's cost per token is this pass over the vocabulary.
double sampling_weights(const float* logits, int64_t n, float inverse_temperature, float* weight) {
  float top = logits[0];
#pragma omp simd reduction(max : top)
  for (int64_t i = 0; i < n; ++i) top = max_of(top, logits[i]);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) weight[i] = exp_approx((logits[i] - top) * inverse_temperature);
  double sum = 0;  // its own loop: with the exponentials, GCC vectorises neither
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; ++i) sum += double(weight[i]);
  return sum;
}

}  // namespace fab::cpu::FAB_ISA
