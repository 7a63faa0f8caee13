#pragma once
// A counter-based generator shared by the CPU and CUDA kernels: element i's draw depends only on
// (key, i), so a mask is the same on every backend and at any thread count.
#include <cstdint>

#ifdef __CUDACC__
#define FAB_HOST_DEVICE __host__ __device__
#else
#define FAB_HOST_DEVICE
#endif

namespace fab {

// splitmix64's finaliser.
FAB_HOST_DEVICE inline uint64_t counter_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Inverted dropout's factor for element i: keep_scale with probability 1 - p, else 0, from a
// uniform draw u in [0, 1) (53 bits) kept when u >= p.
FAB_HOST_DEVICE inline float dropout_factor(uint64_t key, int64_t i, double p, float keep_scale) {
  const double u = double(counter_mix(key + uint64_t(i) * 0x9e3779b97f4a7c15ull) >> 11) * 0x1.0p-53;
  return u >= p ? keep_scale : 0.0f;
}

}  // namespace fab
