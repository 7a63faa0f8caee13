#include "bench/fma_peak.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>

namespace fab::bench {
namespace {

// 12 independent chains: enough to cover the FMA latency (4 cycles) on two FMA ports.
constexpr int kChains = 12;
constexpr long kIterations = 20'000'000;

// flops_<isa>: kChains chains of acc = acc * a + b for kIterations, in the ISA's vectors; returns
// the FLOPs done (2 a lane per FMA). The sum goes to *sink so the loop is not optimised away.
#define FAB_FMA_LOOP(name, isa, Vec, lanes, fma, set1, first_lane)          \
  __attribute__((target(isa))) double name(float* sink) {                   \
    Vec acc[kChains];                                                          \
    for (int c = 0; c < kChains; ++c) acc[c] = set1(1.0f + 1e-7f * float(c));  \
    const Vec a = set1(0.999999f), b = set1(1e-7f);                            \
    for (long i = 0; i < kIterations; ++i)                                     \
      for (int c = 0; c < kChains; ++c) acc[c] = fma(acc[c], a, b);            \
    for (int c = 1; c < kChains; ++c) acc[0] = fma(acc[0], a, acc[c]);         \
    *sink += first_lane(acc[0]);                                               \
    return 2.0 * lanes * kChains * double(kIterations);                        \
  }

FAB_FMA_LOOP(flops_avx2, "avx2,fma", __m256, 8, _mm256_fmadd_ps, _mm256_set1_ps, _mm256_cvtss_f32)
FAB_FMA_LOOP(flops_avx512, "avx512f", __m512, 16, _mm512_fmadd_ps, _mm512_set1_ps, _mm512_cvtss_f32)
#undef FAB_FMA_LOOP

}  // namespace

double measured_fma_peak_gflops(bool avx512, int threads) {
  double best = 0;
  for (int round = 0; round < 3; ++round) {  // best of three: the machine is shared and noisy
    double flops = 0;
    float sink = 0;
    const auto start = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads) reduction(+ : flops, sink)
    flops += avx512 ? flops_avx512(&sink) : flops_avx2(&sink);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best = std::max(best, flops / seconds / 1e9 + 0.0f * sink);
  }
  return best;
}

}  // namespace fab::bench
