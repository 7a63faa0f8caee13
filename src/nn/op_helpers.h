#pragma once
// The few helpers the op files share: the kernel table of a tensor's device, GEMM over tensors,
// bf16 conversion.
#include "core/tensor.h"
#include "kernels/kernel_table.h"
#include "nn/ops.h"

namespace fab {

const KernelTable& kernels_for(const Tensor& t);
int64_t rows_of(const Tensor& x);  // elements / last dimension
Tensor to_bf16(const Tensor& x, MemoryCategory category);
// C (M, N) (+)= op(A) op(B) where A/B are tensors of the same dtype; GemmKind::decode runs the
// table's decode_matmul (B transposed, A not).
void gemm(const KernelTable& k, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, float* c, int64_t m,
          int64_t n, int64_t kdim, bool accumulate, GemmKind kind = GemmKind::standard);

// The rows of one chunk of a head over `vocab` outputs (the chunked cross-entropy and
// log-probability heads): at most `requested` and `rows`, and few enough that the chunk's fp32
// logits stay within 64 MiB (a 152K vocabulary: 110 rows, where 1024 would hold 621 MB), at least 16.
int64_t head_chunk_rows(int64_t requested, int64_t vocab, int64_t rows);

}  // namespace fab
