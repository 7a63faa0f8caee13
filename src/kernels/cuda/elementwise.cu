// Embedding, SwiGLU, residual and bias helpers, cross-entropy, AdamW, norms of gradients: the
// memory-bound kernels. Same semantics as kernels/cpu/elementwise.cpp (the reference); fp32
// arithmetic with accurate expf, so results differ from the CPU's exp_approx in the last bits.
#include <cuda_bf16.h>

#include <cmath>

#include "kernels/cuda/cuda_util.h"
#include "kernels/cuda/elementwise_kernels.cuh"
#include "kernels/cuda/kernels.h"

namespace fab::cuda {
namespace {

using namespace elementwise_kernels;

template <typename... Params, typename... Args>
void launch(const char* name, void (*kernel)(Params...), int64_t n, Args... args) {
  if (n <= 0) return;
  kernel<<<blocks_for(n, kThreads), kThreads, 0, stream()>>>(args...);
  FAB_CUDA_LAUNCHED(name);
}

uint16_t* bits(bf16* p) { return reinterpret_cast<uint16_t*>(p); }

double fetch_double(const double* device_value) {
  double host = 0;
  FAB_CUDA_CHECK(cudaMemcpyAsync(&host, device_value, sizeof host, cudaMemcpyDeviceToHost, stream()));
  FAB_CUDA_CHECK(cudaStreamSynchronize(stream()));
  return host;
}

}  // namespace

void embedding_forward(const int64_t* ids, int64_t n, const float* table, int64_t first, int64_t rows, int64_t c,
                       float* out) {
  launch("embedding_forward", embedding_forward_kernel, n * c, ids, n, table, first, rows, c, out);
}
void embedding_backward(const int64_t* ids, int64_t n, const float* dout, int64_t first, int64_t rows, int64_t c,
                        float* dtable) {
  launch("embedding_backward", embedding_backward_kernel, c, ids, n, dout, first, rows, c, dtable);
}
void swiglu_forward(const float* gate_up, int64_t rows, int64_t i, float* h) {
  launch("swiglu_forward", swiglu_forward_kernel, rows * i, gate_up, rows, i, h);
}
void swiglu_backward(const float* gate_up, const float* dh, int64_t rows, int64_t i, float* dgate_up,
                     bool accumulate) {
  launch("swiglu_backward", swiglu_backward_kernel, rows * i, gate_up, dh, rows, i, dgate_up, accumulate);
}

double cross_entropy_chunk(float* logits, const int64_t* labels, int64_t rows, int64_t vocab, float scale,
                           bf16* grad_bf16) {
  if (rows == 0) return 0.0;
  auto* row_loss = static_cast<double*>(scratch(size_t(rows + 1) * sizeof(double)));
  cross_entropy_kernel<<<unsigned(rows), 512, 0, stream()>>>(logits, labels, vocab, scale,
                                                            grad_bf16 ? bits(grad_bf16) : nullptr, row_loss);
  FAB_CUDA_LAUNCHED("cross_entropy_chunk");
  sum_doubles_kernel<<<1, 512, 0, stream()>>>(row_loss, rows, row_loss + rows);
  FAB_CUDA_LAUNCHED("cross_entropy_chunk (sum)");
  return fetch_double(row_loss + rows);
}

double sampling_weights(const float* logits, int64_t n, float inverse_temperature, float* weight) {
  auto* total = static_cast<double*>(scratch(sizeof(double)));
  sampling_weights_kernel<<<1, 1024, 0, stream()>>>(logits, n, inverse_temperature, weight, total);
  FAB_CUDA_LAUNCHED("sampling_weights");
  return fetch_double(total);
}

void vocab_slice_max(const float* z, int64_t n, int64_t slice, int64_t valid, float* row_max) {
  if (n == 0) return;
  vocab_slice_max_kernel<<<unsigned(n), 512, 0, stream()>>>(z, slice, valid, row_max);
  FAB_CUDA_LAUNCHED("vocab_slice_max");
}
void vocab_slice_exp(float* z, const int64_t* labels, int64_t n, int64_t slice, int64_t valid, int64_t vocab_begin,
                     const float* row_max, double* sums) {
  if (n == 0) return;
  vocab_slice_exp_kernel<<<unsigned(n), 512, 0, stream()>>>(z, labels, n, slice, valid, vocab_begin, row_max, sums);
  FAB_CUDA_LAUNCHED("vocab_slice_exp");
}
void vocab_slice_grad(float* z, const int64_t* labels, int64_t n, int64_t slice, int64_t valid, int64_t vocab_begin,
                      const double* sums, float scale) {
  if (n == 0) return;
  vocab_slice_grad_kernel<<<unsigned(n), 512, 0, stream()>>>(z, labels, slice, valid, vocab_begin, sums, scale);
  FAB_CUDA_LAUNCHED("vocab_slice_grad");
}

void copy_2d(const float* src, int64_t src_ld, float* dst, int64_t dst_ld, int64_t rows, int64_t cols,
             bool accumulate) {
  launch("copy_2d", copy_2d_kernel, rows * cols, src, src_ld, dst, dst_ld, rows, cols, accumulate);
}
void add(const float* a, const float* b, float* out, int64_t n) { launch("add", add_kernel, n, a, b, out, n); }
void multiply(const float* a, const float* b, float* out, int64_t n) {
  launch("multiply", multiply_kernel, n, a, b, out, n);
}
void accumulate(const float* x, float* out, int64_t n) { launch("accumulate", accumulate_kernel, n, x, out, n); }
void dropout_mask(float* mask, int64_t n, uint64_t key, double p, float keep_scale) {
  launch("dropout_mask", dropout_mask_kernel, n, mask, n, key, p, keep_scale);
}
void add_bias(float* y, const float* bias, int64_t rows, int64_t n) {
  launch("add_bias", add_bias_kernel, rows * n, y, bias, rows, n);
}
void scale(float* x, int64_t n, float s) { launch("scale", scale_kernel, n, x, n, s); }
void to_bf16(const float* x, bf16* out, int64_t n) { launch("to_bf16", to_bf16_kernel, n, x, bits(out), n); }

void column_sum(const float* x, int64_t rows, int64_t n, float* out) {
  if (rows <= 0 || n <= 0) return;
  const unsigned slices = unsigned(rows < 64 ? 1 : rows / 64 < 256 ? rows / 64 : 256);
  column_sum_kernel<<<dim3(blocks_for(n, kThreads), slices), kThreads, 0, stream()>>>(x, rows, n, out);
  FAB_CUDA_LAUNCHED("column_sum");
}

void bias_backward(const float* dy, int64_t rows, int64_t n, float* db) { column_sum(dy, rows, n, db); }

double sum_squares(const float* x, int64_t n) {
  if (n <= 0) return 0.0;
  const unsigned blocks = blocks_for(n, kThreads, 1024);
  auto* partial = static_cast<double*>(scratch(size_t(blocks + 1) * sizeof(double)));
  sum_squares_kernel<<<blocks, kThreads, 0, stream()>>>(x, n, partial);
  FAB_CUDA_LAUNCHED("sum_squares");
  sum_doubles_kernel<<<1, 512, 0, stream()>>>(partial, blocks, partial + blocks);
  FAB_CUDA_LAUNCHED("sum_squares (sum)");
  return fetch_double(partial + blocks);
}

void adamw_step(float* param, const float* grad, float* m, float* v, int64_t n, const AdamWArgs& a,
                bf16* param_bf16) {
  const float decay = float(1.0 - double(a.lr) * double(a.weight_decay));
  const float step_size = float(double(a.lr) / (1.0 - std::pow(double(a.beta1), double(a.step))));
  const float bc2_sqrt = float(std::sqrt(1.0 - std::pow(double(a.beta2), double(a.step))));
  launch("adamw_step", adamw_kernel, n, param, grad, m, v, n, decay, step_size, bc2_sqrt, a.beta2, 1.0f - a.beta1,
         1.0f - a.beta2, a.eps, param_bf16 ? bits(param_bf16) : static_cast<uint16_t*>(nullptr));
}

}  // namespace fab::cuda
