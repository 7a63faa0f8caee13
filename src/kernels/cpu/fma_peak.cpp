#include "kernels/cpu/fma_peak.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>

namespace fab::cpu {
namespace {

// 12 independent chains: enough to cover the FMA latency (4 cycles) on two FMA ports.
constexpr int kChains = 12;
constexpr long kIterations = 500'000;  // a round: 6M multiply-adds a thread, ~2.5 ms

// flops_<isa>: kChains chains of acc = acc * a + b (or acc += a . b over bf16 pairs) for
// kIterations, in the ISA's vectors; returns the FLOPs done (2 per multiply-add). The sum goes
// to *sink so the loop is not optimised away.
#define FAB_PEAK_LOOP(name, isa, Vec, Operand, flops_per_op, step, set1, operand, first_lane) \
  __attribute__((target(isa))) double name(float* sink) {                                     \
    Vec acc[kChains];                                                                          \
    for (int c = 0; c < kChains; ++c) acc[c] = set1(1.0f + 1e-7f * float(c));                  \
    const Operand a = operand(0.999999f), b = operand(1e-7f);                                  \
    for (long i = 0; i < kIterations; ++i)                                                     \
      for (int c = 0; c < kChains; ++c) acc[c] = step(acc[c], a, b);                           \
    for (int c = 1; c < kChains; ++c) acc[0] = set1(first_lane(acc[0]) + first_lane(acc[c])); \
    *sink += first_lane(acc[0]);                                                               \
    return double(flops_per_op) * kChains * double(kIterations);                               \
  }

#define FAB_FMA(acc, a, b) _mm256_fmadd_ps(acc, a, b)
#define FAB_FMA512(acc, a, b) _mm512_fmadd_ps(acc, a, b)
#define FAB_DOT_BF16(acc, a, b) _mm512_dpbf16_ps(acc, a, b)
#define FAB_BF16_PAIRS(x) _mm512_cvtne2ps_pbh(_mm512_set1_ps(x), _mm512_set1_ps(x))
FAB_PEAK_LOOP(flops_avx2, "avx2,fma", __m256, __m256, 2 * 8, FAB_FMA, _mm256_set1_ps, _mm256_set1_ps, _mm256_cvtss_f32)
FAB_PEAK_LOOP(flops_avx512, "avx512f", __m512, __m512, 2 * 16, FAB_FMA512, _mm512_set1_ps, _mm512_set1_ps,
              _mm512_cvtss_f32)
// vdpbf16ps: each of 16 fp32 lanes adds the products of two bf16 pairs.
FAB_PEAK_LOOP(flops_bf16_dot, "avx512f,avx512bf16", __m512, __m512bh, 2 * 32, FAB_DOT_BF16, _mm512_set1_ps,
              FAB_BF16_PAIRS, _mm512_cvtss_f32)
#undef FAB_PEAK_LOOP
#undef FAB_FMA
#undef FAB_FMA512
#undef FAB_DOT_BF16
#undef FAB_BF16_PAIRS

template <typename Loop>
double best_gflops(Loop loop, int threads, int rounds) {
  double best = 0;
  for (int round = 0; round < rounds; ++round) {
    double flops = 0;
    float sink = 0;
    const auto start = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads) reduction(+ : flops, sink)
    flops += loop(&sink);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best = std::max(best, flops / seconds / 1e9 + 0.0f * sink);
  }
  return best;
}

}  // namespace

double measured_fma_peak_gflops(bool avx512, int threads, int rounds) {
  return best_gflops(avx512 ? flops_avx512 : flops_avx2, threads, rounds);
}

double measured_bf16_dot_peak_gflops(int threads, int rounds) {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx512bf16")) return 0;
  return best_gflops(flops_bf16_dot, threads, rounds);
}

}  // namespace fab::cpu
