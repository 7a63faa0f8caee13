#pragma once
// CPU kernels of the rollout engine's decode step (models/decoder.cpp, the slot path), outside
// the KernelTable because no other backend runs that path. Built per ISA like the table's and
// chosen with it (the AVX-512 ones where cpu_kernels() is AVX-512).
#include "kernels/kernel_table.h"

namespace fab {

struct DecodeKernels {
  const char* isa;
  // C (M, N) (+)= A (M, K) x B^T, B stored (N, K): MatmulArgs with trans_b set and trans_a not.
  // Lock-free and allocation-free: threads may run it at once (each single-threaded inside a
  // parallel region); outside one it splits the columns over the threads. Each output's sum has
  // one fixed order, whatever M or the thread count.
  void (*matmul)(const MatmulArgs& args);
  // weight[i] = exp((logits[i] - max logit) * inverse_temperature) for i < n; returns their sum.
  double (*sampling_weights)(const float* logits, int64_t n, float inverse_temperature, float* weight);
};

// The table of the ISA cpu_kernels() runs.
const DecodeKernels& cpu_decode_kernels();
// A specific one ("avx512" or "avx2"), or nullptr when this CPU cannot run it (tests).
const DecodeKernels* cpu_decode_kernels_for_isa(const char* isa);

}  // namespace fab
