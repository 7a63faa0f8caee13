// Included once per ISA translation unit (no guard needed: one include per file).
// Branch-free scalar math that the compiler vectorises inside `#pragma omp simd` loops
// (glibc's vector expf is only offered under -ffast-math, which we do not use).
// Everything here lives in the per-ISA namespace: an inline function shared by the AVX-512 and
// AVX2 objects could be linked from the AVX-512 one and break the AVX2 fallback. For the same
// reason the kernels take scratch memory from ScratchBuffer (compiled once), not std::vector.
#include <cmath>
#include <cstdint>
#include <bit>

#ifndef FAB_ISA
#error "include isa_kernels.h first"
#endif

namespace fab::cpu::FAB_ISA {

// exp(x) by Cody-Waite range reduction x = n ln2 + r and a degree-6 polynomial for e^r
// (Cephes expf coefficients): relative error ~1 ulp over the float range; exp(-inf) -> ~0.
inline float exp_approx(float x) {
  x = x < -87.3f ? -87.3f : x;  // comparisons, not std::fmin/fmax: those are libm calls that
  x = x > 88.7f ? 88.7f : x;    // block vectorisation

  // n = round(x / ln2) by the 1.5 * 2^23 trick: std::floor would block vectorisation.
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const float scale = std::bit_cast<float>((int32_t(n) + 127) << 23);
  return p * scale;
}

inline float sigmoid(float x) { return 1.0f / (1.0f + exp_approx(-x)); }

inline float max_of(float a, float b) { return a > b ? a : b; }

// float -> bf16 bits, rounding to nearest even (inputs are finite here).
inline uint16_t bf16_bits(float x) {
  uint32_t u = std::bit_cast<uint32_t>(x);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

// Per-thread row ranges for work split by hand (contiguous, deterministic for a thread count).
struct Range {
  int64_t begin, end;
};
inline Range split_range(int64_t n, int parts, int index) {
  int64_t chunk = n / parts, extra = n % parts;
  int64_t begin = index * chunk + (index < extra ? index : extra);
  return {begin, begin + chunk + (index < extra ? 1 : 0)};
}

}  // namespace fab::cpu::FAB_ISA
