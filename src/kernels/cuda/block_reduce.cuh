#pragma once
// Block-wide sum and max over all threads of a block (blockDim.x a multiple of 32, at most 1024):
// every thread gets the result. Uses 32 slots of shared memory and two barriers.

namespace fab::cuda {

template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
  for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int off = 16; off > 0; off /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

template <typename T, typename Op>
__device__ __forceinline__ T block_reduce(T v, Op warp_op) {
  __shared__ T slots[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_op(v);
  __syncthreads();  // slots may still be read by a previous reduction
  if (lane == 0) slots[warp] = v;
  __syncthreads();
  v = slots[0];
  for (int w = 1; w < warps; ++w) v = warp_op.combine(v, slots[w]);
  return v;
}

struct SumOp {
  template <typename T>
  __device__ T operator()(T v) const { return warp_sum(v); }
  template <typename T>
  __device__ T combine(T a, T b) const { return a + b; }
};
struct MaxOp {
  __device__ float operator()(float v) const { return warp_max(v); }
  __device__ float combine(float a, float b) const { return fmaxf(a, b); }
};

template <typename T>
__device__ __forceinline__ T block_sum(T v) { return block_reduce(v, SumOp{}); }
__device__ __forceinline__ float block_max(float v) { return block_reduce(v, MaxOp{}); }

}  // namespace fab::cuda
