// fabrica_gpu_tests links the CPU kernels as the reference but not oneDNN (the GPU machine lacks
// it, and the binary must travel light): this plain triple loop stands in for cpu::matmul there.
// Accumulates in double, so it is the more exact side of every GEMM comparison.
#include <string>

#include "core/dtype.h"
#include "kernels/cpu/matmul_onednn.h"
#include "kernels/kernel_table.h"

namespace fab::cpu {

void matmul(const MatmulArgs& x) {
  auto at = [&](const void* p, int64_t i) {
    return x.dtype == DType::bf16 ? double(to_f32(static_cast<const bf16*>(p)[i])) : double(static_cast<const float*>(p)[i]);
  };
#pragma omp parallel for collapse(2)
  for (int64_t i = 0; i < x.m; ++i)
    for (int64_t j = 0; j < x.n; ++j) {
      double sum = 0;
      for (int64_t p = 0; p < x.k; ++p)
        sum += at(x.a, x.trans_a ? p * x.m + i : i * x.k + p) * at(x.b, x.trans_b ? j * x.k + p : p * x.n + j);
      float& c = x.c[i * x.n + j];
      c = x.accumulate ? float(c + sum) : float(sum);
    }
}

std::string onednn_description() { return "reference triple loop (fabrica_gpu_tests)"; }

}  // namespace fab::cpu
