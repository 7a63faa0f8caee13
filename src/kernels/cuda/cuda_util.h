#pragma once
// Shared by the CUDA backend's host code and its .cu kernels: checked CUDA calls, the stream every
// kernel runs on, and a device scratch buffer for reductions whose result goes back to the host.
#include <cuda_runtime.h>

#include <cstdint>

#include "core/error.h"

#define FAB_CUDA_CHECK(call)                                                                         \
  do {                                                                                               \
    const cudaError_t fab_cuda_err_ = (call);                                                        \
    FAB_CHECK(fab_cuda_err_ == cudaSuccess, "CUDA call {} failed: {} ({})", #call,                   \
              cudaGetErrorName(fab_cuda_err_), cudaGetErrorString(fab_cuda_err_));                   \
  } while (0)

// After a kernel launch: reports a bad launch configuration at once, naming the kernel. Errors
// inside the kernel surface at the next synchronising call.
#define FAB_CUDA_LAUNCHED(name)                                                                      \
  do {                                                                                               \
    const cudaError_t fab_cuda_err_ = cudaGetLastError();                                            \
    FAB_CHECK(fab_cuda_err_ == cudaSuccess, "CUDA kernel {} failed to launch: {}", name,             \
              cudaGetErrorString(fab_cuda_err_));                                                    \
  } while (0)

namespace fab::cuda {

// The stream of this process's device (made on first use; the CUDA backend must be available).
cudaStream_t stream();
// This process's device (the probed index: the node-local rank modulo the visible devices).
int device_index();
// A device buffer of at least `bytes`, reused by later calls: valid until the next call. Callers
// use it only within one call that synchronises before it returns.
void* scratch(size_t bytes);

inline unsigned blocks_for(int64_t n, int threads, int64_t max_blocks = 65535LL * 16) {
  const int64_t b = (n + threads - 1) / threads;
  return unsigned(b < 1 ? 1 : b > max_blocks ? max_blocks : b);
}

}  // namespace fab::cuda
