// Included once per ISA translation unit, after isa_kernels.h (like vec_math.h): a vector of
// floats as a GCC vector extension, the width of the build's registers (16 lanes in the AVX-512
// build, 8 in the AVX2 build), for kernels that keep rows in registers.
#include <bit>
#include <cstdint>
#include <cstring>

#ifndef FAB_ISA
#error "include isa_kernels.h first"
#endif

namespace fab::cpu::FAB_ISA {

#ifdef __AVX512F__
constexpr int kLanes = 16;
#else
constexpr int kLanes = 8;
#endif

using Floats = float __attribute__((vector_size(kLanes * 4)));
using Words = uint32_t __attribute__((vector_size(kLanes * 4)));
using Halves = uint16_t __attribute__((vector_size(kLanes * 2)));

inline Floats load(const float* p) {
  Floats v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// A bf16 is the upper half of a float: widening is exact.
inline Floats load(const uint16_t* p) {
  Halves h;
  std::memcpy(&h, p, sizeof h);
  return Floats(__builtin_convertvector(h, Words) << 16);
}

inline void store(float* p, Floats v) { std::memcpy(p, &v, sizeof v); }

// The lanes' sum by a fixed tree: halves added until one lane is left.
inline float lane_sum(Floats v) {
#ifdef __AVX512F__
  using Eight = float __attribute__((vector_size(32)));
  const Eight e = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
                  __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
#else
  const Floats e = v;
#endif
  using Four = float __attribute__((vector_size(16)));
  const Four f = __builtin_shufflevector(e, e, 0, 1, 2, 3) + __builtin_shufflevector(e, e, 4, 5, 6, 7);
  return (f[0] + f[2]) + (f[1] + f[3]);
}

}  // namespace fab::cpu::FAB_ISA
