#pragma once
// CUDA's few built-ins that our kernels use, emulated on the CPU: one OS thread per CUDA thread,
// std::barrier for __syncthreads and for the warp shuffles and the tensor-core mma, one block at a
// time (so __shared__ can be static), atomics under a mutex. Include this, then a kernels header
// (src/kernels/cuda/*_kernels.cuh), then call emulate(). It checks indexing, tiling, masking and
// reductions against the CPU kernels where no GPU exists; it says nothing about speed, races
// between blocks or the hardware itself (tests/gpu/ runs the real thing).
#include <barrier>
#include <climits>
#include <cmath>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/dtype.h"

// ---- the emulated built-ins ---------------------------------------------------------------------
struct EmuDim3 {
  unsigned x = 1, y = 1, z = 1;
};
inline thread_local EmuDim3 threadIdx, blockIdx, blockDim, gridDim;

struct EmuBlock {
  std::unique_ptr<std::barrier<>> all;
  std::vector<std::unique_ptr<std::barrier<>>> warps;
  std::vector<double> lanes;  // wide enough for the float and double shuffles
  std::vector<uint32_t> mma_lanes;  // each lane's mma fragments: a[0..4), b0, b1
  std::mutex atomics;
};
inline thread_local EmuBlock* emu_block = nullptr;

inline void __syncthreads() { emu_block->all->arrive_and_wait(); }

template <typename T>
inline T __shfl_xor_sync(unsigned, T v, int offset) {
  const unsigned t = threadIdx.x, warp = t / 32;
  emu_block->lanes[t] = double(v);
  emu_block->warps[warp]->arrive_and_wait();
  const T other = T(emu_block->lanes[warp * 32 + ((t % 32) ^ unsigned(offset))]);
  emu_block->warps[warp]->arrive_and_wait();
  return other;
}

// mma.sync.m16n8k16.row.col.f32.bf16.bf16.f32 with C = D = acc (see mma_bf16 in
// attention_tc_kernels.cuh for the fragment layouts of the PTX ISA): every lane deposits its A and
// B fragments, then computes its own four elements of D from the whole warp's (fp32 sums in k order).
constexpr int kEmuMmaWords = 6;

inline float emu_bf16_half(uint32_t word, int high) { return fab::to_f32(fab::bf16{uint16_t(word >> (16 * high))}); }

inline void emulated_mma_m16n8k16_bf16(float (&acc)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  const unsigned t = threadIdx.x, warp = t / 32, lane = t % 32;
  uint32_t* words = emu_block->mma_lanes.data();
  for (int i = 0; i < 4; ++i) words[t * kEmuMmaWords + i] = a[i];
  words[t * kEmuMmaWords + 4] = b0, words[t * kEmuMmaWords + 5] = b1;
  emu_block->warps[warp]->arrive_and_wait();
  auto word_of = [&](unsigned owner, int reg) { return words[(warp * 32 + owner) * kEmuMmaWords + reg]; };
  // A[row][k]: lane 4 (row % 8) + (k % 8) / 2, register (row >= 8) + 2 (k >= 8), half k % 2.
  auto a_at = [&](int row, int k) {
    return emu_bf16_half(word_of(unsigned(4 * (row % 8) + (k % 8) / 2), (row >= 8) + 2 * (k >= 8)), k % 2);
  };
  // B[k][col]: lane 4 col + (k % 8) / 2, register b0 or b1 (k >= 8), half k % 2.
  auto b_at = [&](int k, int col) { return emu_bf16_half(word_of(unsigned(4 * col + (k % 8) / 2), 4 + (k >= 8)), k % 2); };
  float d[4];
  for (int e = 0; e < 4; ++e) {
    const int row = int(lane / 4) + 8 * (e / 2), col = 2 * int(lane % 4) + e % 2;
    float sum = acc[e];
    for (int k = 0; k < 16; ++k) sum += a_at(row, k) * b_at(k, col);
    d[e] = sum;
  }
  emu_block->warps[warp]->arrive_and_wait();  // every lane has read the fragments
  for (int e = 0; e < 4; ++e) acc[e] = d[e];
}

inline float atomicAdd(float* p, float v) {
  std::lock_guard lock(emu_block->atomics);
  const float old = *p;
  *p = old + v;
  return old;
}

inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }

struct EmuBf16 {
  uint16_t bits;
};
inline EmuBf16 __float2bfloat16_rn(float x) { return {fab::to_bf16(x).bits}; }
inline uint16_t __bfloat16_as_ushort(EmuBf16 h) { return h.bits; }

inline int atomicMin(int* p, int v) {
  std::lock_guard lock(emu_block->atomics);
  const int old = *p;
  if (v < old) *p = v;
  return old;
}

#define FAB_CUDA_EMULATION 1
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(n)

// Runs kernel(args) over `grid` blocks of `threads` threads, one block after another.
template <typename... Params, typename... Args>
void emulate(void (*kernel)(Params...), EmuDim3 grid, unsigned threads, Args... args) {
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        EmuBlock block;
        block.all = std::make_unique<std::barrier<>>(threads);
        for (unsigned w = 0; w < threads / 32; ++w) block.warps.push_back(std::make_unique<std::barrier<>>(32));
        block.lanes.resize(threads);
        block.mma_lanes.resize(threads * kEmuMmaWords);
        std::vector<std::thread> pool;
        for (unsigned t = 0; t < threads; ++t)
          pool.emplace_back([&, t] {
            threadIdx = {t, 0, 0}, blockIdx = {x, y, z}, blockDim = {threads, 1, 1}, gridDim = grid;
            emu_block = &block;
            kernel(args...);
          });
        for (std::thread& t : pool) t.join();
      }
}

