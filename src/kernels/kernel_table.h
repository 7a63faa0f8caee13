#pragma once
// Every compute kernel a backend provides, as plain functions over raw device pointers.
// Layout conventions: row-major; activations (rows, C) with rows = B*T; attention tensors
// (B, T, heads, D). Backward kernels ACCUMULATE (+=) into every gradient they write, so one
// buffer can collect the contributions of several uses (tied embeddings, residual streams);
// swiglu_backward and copy_2d take an `accumulate` flag and overwrite a fresh buffer without it.
#include <cstdint>

#include "core/dtype.h"

namespace fab {

struct MatmulArgs {
  // C (M, N) = op(A) (M, K) x op(B) (K, N), f32 output; op transposes when trans_* is set
  // (A stored (K, M), B stored (N, K)). A and B are f32 or both bf16 (fp32 accumulation).
  const void* a = nullptr;
  const void* b = nullptr;
  float* c = nullptr;
  int64_t m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
  bool accumulate = false;  // C += ... instead of C = ...
  DType dtype = DType::f32;
};

struct AttentionShape {
  int64_t batch, seq, heads, kv_heads, head_dim;
  float scale;
  // Document mask of packed rows (neat_packing): (batch, seq) i32, the index of the first token
  // of each token's document; query t attends to keys s with doc_start[t] <= s <= t. nullptr:
  // plain causal. Training attention only (attention_decode ignores it).
  const int32_t* doc_start = nullptr;
  // bf16 compute allowed (the model's bf16 mode): the CUDA backend then runs Q K^T and P V on
  // tensor cores with bf16 operands and fp32 sums (head_dim 64 and 128). The CPU kernels ignore it.
  bool bf16_compute = false;
};

struct AdamWArgs {
  float lr, beta1, beta2, eps, weight_decay;
  int64_t step;  // 1-based: the bias corrections use beta^step
};

struct KernelTable {
  const char* isa;

  void (*matmul)(const MatmulArgs& args);

  // out[i, :] = table[ids[i], :]
  // The table holds the rows of ids [first, first + rows) (the whole vocabulary, or a tensor-
  // parallel rank's slice): out[i] = table[ids[i] - first], zeros for an id outside it;
  // dtable[ids[i] - first] += dout[i], nothing for one outside.
  void (*embedding_forward)(const int64_t* ids, int64_t n, const float* table, int64_t first, int64_t rows,
                            int64_t c, float* out);
  void (*embedding_backward)(const int64_t* ids, int64_t n, const float* dout, int64_t first, int64_t rows,
                             int64_t c, float* dtable);

  // y = x * rstd * w, rstd = 1/sqrt(mean(x^2) + eps) per row (fp32 statistics)
  void (*rmsnorm_forward)(const float* x, const float* w, int64_t rows, int64_t c, float eps, float* y, float* rstd);
  void (*rmsnorm_backward)(const float* x, const float* w, const float* rstd, const float* dy, int64_t rows,
                           int64_t c, float* dx, float* dw);

  // Hugging Face rotate-half RoPE, y = rope(x) with x (rows = B*T, heads, d); cos/sin tables are
  // (max_positions, d/2) and positions (rows) picks each row's angle. y may alias x.
  void (*rope_forward)(const float* x, float* y, const int64_t* positions, const float* cos, const float* sin,
                       int64_t rows, int64_t heads, int64_t d);
  // dx += (the rotation transposed) dy
  void (*rope_backward)(const float* dy, float* dx, const int64_t* positions, const float* cos, const float* sin,
                        int64_t rows, int64_t heads, int64_t d);

  // Causal grouped-query attention (within documents when s.doc_start is set); keeps only out and
  // the row log-sum-exp (B, H, T).
  void (*attention_forward)(const float* q, const float* k, const float* v, const AttentionShape& s, float* out,
                            float* lse);
  void (*attention_backward)(const float* q, const float* k, const float* v, const float* out, const float* lse,
                             const float* dout, const AttentionShape& s, float* dq, float* dk, float* dv);

  // Inference with a KV cache: q (B, n, H, D) are the queries at positions past .. past+n-1;
  // k_cache / v_cache (B, capacity, KVH, D) already hold keys and values 0 .. past+n-1.
  void (*attention_decode)(const float* q, const float* k_cache, const float* v_cache, const AttentionShape& s,
                           int64_t past, int64_t capacity, float* out);
  // The GEMM of generation: C (M, N) (+)= A (M, K) x B^T, B stored (N, K) (trans_b set, trans_a
  // not), M small (a decode step's rows). Every output is one sum in one fixed order whatever M,
  // the row's place or the thread count, so a sequence's logits do not depend on its batch; on the
  // CPU it holds no lock and no shared buffer, so threads may run it at once (each single-threaded
  // inside a parallel region).
  void (*decode_matmul)(const MatmulArgs& args);
  // weight[i] = exp((logits[i] - max logit) * inverse_temperature) for i < n; returns their sum.
  double (*sampling_weights)(const float* logits, int64_t n, float inverse_temperature, float* weight);

  // gate_up rows are [gate (i), up (i)]; h = silu(gate) * up
  void (*swiglu_forward)(const float* gate_up, int64_t rows, int64_t i, float* h);
  // dgate_up (+)= d h / d gate_up; overwrites when accumulate is false (a fresh gradient buffer)
  void (*swiglu_backward)(const float* gate_up, const float* dh, int64_t rows, int64_t i, float* dgate_up,
                          bool accumulate);

  // Cross-entropy of one chunk of rows. The gradient scale * (softmax - onehot) (zero rows where
  // label == -100) replaces the logits in place, or, when grad_bf16 is not null, goes there in
  // bf16 (what bf16 mode's GEMMs read) and the logits are scratch (the CPU kernel leaves the
  // exponentials there). Returns the sum of the rows' losses.
  double (*cross_entropy_chunk)(float* logits, const int64_t* labels, int64_t rows, int64_t vocab, float scale,
                                bf16* grad_bf16);

  // The vocabulary-parallel cross-entropy over one rank's slice z (n, slice) of the logits, whose
  // first `valid` columns are real vocabulary (ids vocab_begin ...), in three passes around the
  // collectives (parallel/tensor_parallel.cpp):
  //   vocab_slice_max:  row_max[i] = the slice's row maximum (-FLT_MAX when valid is 0);
  //   vocab_slice_exp:  given M (row_max, over every rank), z <- exp(z - M) on the valid columns,
  //                     sums[i] = the row's sum (double), sums[n + i] = the target's logit where
  //                     the slice holds it (else 0);
  //   vocab_slice_grad: given S (sums[i], over every rank), z <- scale (z / S - onehot(target)),
  //                     zeros on the padding columns and on rows labelled -100.
  void (*vocab_slice_max)(const float* z, int64_t n, int64_t slice, int64_t valid, float* row_max);
  void (*vocab_slice_exp)(float* z, const int64_t* labels, int64_t n, int64_t slice, int64_t valid,
                          int64_t vocab_begin, const float* row_max, double* sums);
  void (*vocab_slice_grad)(float* z, const int64_t* labels, int64_t n, int64_t slice, int64_t valid,
                           int64_t vocab_begin, const double* sums, float scale);

  // dst[r, 0:cols] (+)= src[r, 0:cols] with leading dimensions src_ld / dst_ld
  void (*copy_2d)(const float* src, int64_t src_ld, float* dst, int64_t dst_ld, int64_t rows, int64_t cols,
                  bool accumulate);
  void (*add)(const float* a, const float* b, float* out, int64_t n);         // out = a + b
  void (*multiply)(const float* a, const float* b, float* out, int64_t n);    // out = a * b
  void (*accumulate)(const float* x, float* out, int64_t n);                  // out += x
  void (*add_bias)(float* y, const float* bias, int64_t rows, int64_t n);     // y[r, :] += bias
  void (*bias_backward)(const float* dy, int64_t rows, int64_t n, float* db); // db += sum_r dy[r, :]
  void (*scale)(float* x, int64_t n, float s);
  double (*sum_squares)(const float* x, int64_t n);
  void (*to_bf16)(const float* x, bf16* out, int64_t n);
  // mask[i] = kernels/counter_rng.h's dropout_factor(key, i, p, keep_scale): inverted dropout's
  // mask, the same on every backend.
  void (*dropout_mask)(float* mask, int64_t n, uint64_t key, double p, float keep_scale);

  // One AdamW update; when param_bf16 is not null it also receives the new weights in bf16
  // (the compute copy of bf16 mode), saving a separate pass over the parameters.
  void (*adamw_step)(float* param, const float* grad, float* m, float* v, int64_t n, const AdamWArgs& args,
                     bf16* param_bf16);
};

// Every slot of KernelTable by name, in order; the static_assert below keeps the list complete.
#define FAB_KERNEL_SLOTS(X) X(isa) X(matmul) X(embedding_forward) X(embedding_backward) X(rmsnorm_forward) \
  X(rmsnorm_backward) X(rope_forward) X(rope_backward) X(attention_forward) X(attention_backward) \
  X(attention_decode) X(decode_matmul) X(sampling_weights) X(swiglu_forward) X(swiglu_backward) X(cross_entropy_chunk) X(vocab_slice_max) \
  X(vocab_slice_exp) X(vocab_slice_grad) X(copy_2d) X(add) X(multiply) \
  X(accumulate) X(add_bias) X(bias_backward) X(scale) X(sum_squares) X(to_bf16) X(dropout_mask) X(adamw_step)

#define FAB_COUNT_SLOT(slot) +1
static_assert(sizeof(KernelTable) == (0 FAB_KERNEL_SLOTS(FAB_COUNT_SLOT)) * sizeof(void*),
              "FAB_KERNEL_SLOTS must name every slot of KernelTable");
#undef FAB_COUNT_SLOT

// The name of the first slot a table leaves empty, or nullptr when every slot is filled. Each
// backend fills its table with designated initialisers (.matmul = ...) and static_asserts that
// this is nullptr, so a table with an empty slot does not build.
constexpr const char* empty_kernel_slot(const KernelTable& table) {
#define FAB_EMPTY_SLOT(slot) \
  if (table.slot == nullptr) return #slot;
  FAB_KERNEL_SLOTS(FAB_EMPTY_SLOT)
#undef FAB_EMPTY_SLOT
  return nullptr;
}

// The CPU table, chosen once at run time: AVX-512 kernels where the CPU has them, else AVX2
// (FAB_CPU_ISA=avx2 forces the fallback).
const KernelTable& cpu_kernels();
// A specific CPU table ("avx512" or "avx2"), or nullptr when this CPU cannot run it (tests).
const KernelTable* cpu_kernels_for_isa(const char* isa);

}  // namespace fab
