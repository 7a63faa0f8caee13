#pragma once
// The CUDA kernels of the KernelTable (kernels/kernel_table.h has the contract: raw device
// pointers, row-major, backward kernels accumulate). Every one runs on fab::cuda::stream();
// the two that return a value (cross_entropy_chunk, sum_squares) wait for it.
#include "kernels/kernel_table.h"

namespace fab::cuda {

void matmul(const MatmulArgs& args);  // cuBLASLt (matmul_cublaslt.cpp)

void embedding_forward(const int64_t* ids, int64_t n, const float* table, int64_t c, float* out);
void embedding_backward(const int64_t* ids, int64_t n, const float* dout, int64_t c, float* dtable);
void rmsnorm_forward(const float* x, const float* w, int64_t rows, int64_t c, float eps, float* y, float* rstd);
void rmsnorm_backward(const float* x, const float* w, const float* rstd, const float* dy, int64_t rows, int64_t c,
                      float* dx, float* dw);
void rope_forward(const float* x, float* y, const int64_t* positions, const float* cos, const float* sin,
                  int64_t rows, int64_t heads, int64_t d);
void rope_backward(const float* dy, float* dx, const int64_t* positions, const float* cos, const float* sin,
                   int64_t rows, int64_t heads, int64_t d);
void attention_forward(const float* q, const float* k, const float* v, const AttentionShape& s, float* out,
                       float* lse);
void attention_backward(const float* q, const float* k, const float* v, const float* out, const float* lse,
                        const float* dout, const AttentionShape& s, float* dq, float* dk, float* dv);
void attention_decode(const float* q, const float* k_cache, const float* v_cache, const AttentionShape& s,
                      int64_t past, int64_t capacity, float* out);
void swiglu_forward(const float* gate_up, int64_t rows, int64_t i, float* h);
void swiglu_backward(const float* gate_up, const float* dh, int64_t rows, int64_t i, float* dgate_up,
                     bool accumulate);
double cross_entropy_chunk(float* logits, const int64_t* labels, int64_t rows, int64_t vocab, float scale,
                           bf16* grad_bf16);
void copy_2d(const float* src, int64_t src_ld, float* dst, int64_t dst_ld, int64_t rows, int64_t cols,
             bool accumulate);
void add(const float* a, const float* b, float* out, int64_t n);
void accumulate(const float* x, float* out, int64_t n);
void add_bias(float* y, const float* bias, int64_t rows, int64_t n);
void bias_backward(const float* dy, int64_t rows, int64_t n, float* db);
void scale(float* x, int64_t n, float s);
double sum_squares(const float* x, int64_t n);
void to_bf16(const float* x, bf16* out, int64_t n);
void adamw_step(float* param, const float* grad, float* m, float* v, int64_t n, const AdamWArgs& args,
                bf16* param_bf16);

// out[j] += sum over rows r of x[r, j] (bias and RMSNorm weight gradients; elementwise.cu).
void column_sum(const float* x, int64_t rows, int64_t n, float* out);

// The table of the functions above (cuda_backend.cpp).
const KernelTable& cuda_kernels();

}  // namespace fab::cuda
