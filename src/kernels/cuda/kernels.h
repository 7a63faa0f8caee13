#pragma once
// The CUDA kernels of the KernelTable (kernels/kernel_table.h has the contract: raw device
// pointers, row-major, backward kernels accumulate). Every one runs on fab::cuda::stream();
// the two that return a value (cross_entropy_chunk, sum_squares) wait for it.
#include "kernels/kernel_table.h"

namespace fab::cuda {

void matmul(const MatmulArgs& args);  // cuBLASLt (matmul_cublaslt.cpp)

#include "kernels/kernel_functions.inc"

// out[j] += sum over rows r of x[r, j] (bias and RMSNorm weight gradients; elementwise.cu).
void column_sum(const float* x, int64_t rows, int64_t n, float* out);

// The table of the functions above (cuda_backend.cpp).
const KernelTable& cuda_kernels();

}  // namespace fab::cuda
