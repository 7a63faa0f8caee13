// Launches of the attention kernels: the bf16 tensor-core ones (attention_tc_kernels.cuh) when the
// shape allows bf16 compute and head_dim is 64 or 128, the fp32 ones (attention_kernels.cuh)
// otherwise and for decode; grid shapes, head_dim dispatch and the order of the backward's kernels.
#include <cuda_bf16.h>

#include "kernels/cuda/attention_kernels.cuh"
#include "kernels/cuda/attention_tc_kernels.cuh"
#include "kernels/cuda/cuda_util.h"
#include "kernels/cuda/kernels.h"

namespace fab::cuda {
namespace {

using namespace attention_kernels;

// head_dim rounded up to the kernels' widths: 32, 64 or 128.
int width_for(int64_t d) {
  FAB_CHECK(d > 0 && d <= 128, "the CUDA attention kernels support head_dim up to 128, not {}", d);
  return d <= 32 ? 32 : d <= 64 ? 64 : 128;
}

void check_shape(const AttentionShape& s) {
  FAB_CHECK(s.kv_heads > 0 && s.heads % s.kv_heads == 0, "attention: {} heads not a multiple of {} kv heads",
            s.heads, s.kv_heads);
  FAB_CHECK(s.heads <= 65535 && s.batch <= 65535, "attention: batch {} or heads {} beyond the CUDA grid",
            s.batch, s.heads);
}

// Instantiates a kernel template for each width; P threads per row: DT = width / P.
#define FAB_ATTENTION_LAUNCH(kernel, P, width, grid, args)                                          \
  do {                                                                                              \
    if ((width) == 32) kernel<32 / (P)><<<grid, kThreads, 0, stream()>>>(args);                     \
    else if ((width) == 64) kernel<64 / (P)><<<grid, kThreads, 0, stream()>>>(args);                \
    else kernel<128 / (P)><<<grid, kThreads, 0, stream()>>>(args);                                  \
    FAB_CUDA_LAUNCHED(#kernel);                                                                     \
  } while (0)

Args args_of(const AttentionShape& s) {
  Args a{};
  a.doc = s.doc_start;
  a.tq = s.seq;
  a.kv_stride = s.seq;
  a.heads = s.heads;
  a.kv_heads = s.kv_heads;
  a.d = s.head_dim;
  a.scale = s.scale;
  return a;
}

bool tensor_cores_for(const AttentionShape& s) { return s.bf16_compute && (s.head_dim == 64 || s.head_dim == 128); }

// The tensor-core kernels, instantiated for head_dim 64 and 128; a block is 64 query (or key) rows.
#define FAB_ATTENTION_TC_LAUNCH(kernel, d, grid, args)                                                 \
  do {                                                                                              \
    if ((d) == 64) attention_tc::kernel<64><<<grid, attention_tc::kThreads, 0, stream()>>>(args);   \
    else attention_tc::kernel<128><<<grid, attention_tc::kThreads, 0, stream()>>>(args);            \
    FAB_CUDA_LAUNCHED(#kernel);                                                                     \
  } while (0)

dim3 tc_grid(const AttentionShape& s, int64_t heads) {
  return dim3(unsigned((s.seq + attention_tc::kBlockRows - 1) / attention_tc::kBlockRows), unsigned(heads),
              unsigned(s.batch));
}

void tc_forward(const Args& a, const AttentionShape& s) {
  FAB_ATTENTION_TC_LAUNCH(forward_kernel, s.head_dim, tc_grid(s, s.heads), a);
}

// D = rowsum(dO * O) first, then dQ (per query block) and dK, dV (per key block), independent.
void tc_backward(const Args& a, const AttentionShape& s) {
  const int64_t stat_rows = s.batch * s.seq * s.heads;
  const unsigned blocks = unsigned((stat_rows + attention_tc::kWarps - 1) / attention_tc::kWarps);
  attention_tc::row_dot_kernel<<<blocks, attention_tc::kThreads, 0, stream()>>>(a, stat_rows);
  FAB_CUDA_LAUNCHED("row_dot_kernel");
  FAB_ATTENTION_TC_LAUNCH(dq_kernel, s.head_dim, tc_grid(s, s.heads), a);
  FAB_ATTENTION_TC_LAUNCH(dkdv_kernel, s.head_dim, tc_grid(s, s.kv_heads), a);
}

}  // namespace

void attention_forward(const float* q, const float* k, const float* v, const AttentionShape& s, float* out,
                       float* lse) {
  check_shape(s);
  if (s.batch == 0 || s.seq == 0) return;
  Args a = args_of(s);
  a.q = q, a.k = k, a.v = v, a.o_write = out, a.lse_write = lse;
  if (tensor_cores_for(s)) return tc_forward(a, s);
  const dim3 grid(unsigned((s.seq + 63) / 64), unsigned(s.heads), unsigned(s.batch));
  FAB_ATTENTION_LAUNCH(forward_kernel, 4, width_for(s.head_dim), grid, a);
}

void attention_backward(const float* q, const float* k, const float* v, const float* out, const float* lse,
                        const float* dout, const AttentionShape& s, float* dq, float* dk, float* dv) {
  check_shape(s);
  if (s.batch == 0 || s.seq == 0) return;
  Args a = args_of(s);
  a.q = q, a.k = k, a.v = v, a.out = out, a.lse = lse, a.dout = dout, a.dq = dq, a.dk = dk, a.dv = dv;
  a.dvec = static_cast<float*>(scratch(size_t(s.batch * s.heads * s.seq) * sizeof(float)));
  if (tensor_cores_for(s)) return tc_backward(a, s);
  const int width = width_for(s.head_dim);
  const dim3 q_grid(unsigned((s.seq + 63) / 64), unsigned(s.heads), unsigned(s.batch));
  FAB_ATTENTION_LAUNCH(dq_kernel, 4, width, q_grid, a);  // also writes dvec for dkdv_kernel
  const dim3 kv_grid(unsigned((s.seq + 31) / 32), unsigned(s.kv_heads), unsigned(s.batch));
  FAB_ATTENTION_LAUNCH(dkdv_kernel, 8, width, kv_grid, a);
}

// Decode: the forward kernel with queries at positions past.. and keys read from the caches
// (row stride `capacity`); no log-sum-exp, no document mask.
void attention_decode(const float* q, const float* k_cache, const float* v_cache, const AttentionShape& s,
                      int64_t past, int64_t capacity, float* out) {
  check_shape(s);
  if (s.batch == 0 || s.seq == 0) return;
  Args a = args_of(s);
  a.doc = nullptr;
  a.kv_stride = capacity;
  a.pos0 = past;
  a.q = q, a.k = k_cache, a.v = v_cache, a.o_write = out;
  const dim3 grid(unsigned((s.seq + 63) / 64), unsigned(s.heads), unsigned(s.batch));
  FAB_ATTENTION_LAUNCH(forward_kernel, 4, width_for(s.head_dim), grid, a);
}

}  // namespace fab::cuda
