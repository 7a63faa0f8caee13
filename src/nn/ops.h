#pragma once
// Differentiable ops over Vars, each a forward kernel call plus one tape closure that calls the
// backward kernel. Shapes: activations (rows, C) with rows = B*T; attention inputs (B, T, heads, D).
#include <array>
#include <cstdint>
#include <vector>

#include "autograd/tape.h"
#include "kernels/kernel_table.h"

namespace fab {

enum class Precision { fp32, bf16 };

// Which GEMM a linear runs: the backend's matmul (training, evaluation), or its decode_matmul
// (generation: one fixed summation order per output whatever the batch; lock-free on the CPU).
enum class GemmKind { standard, decode };

// A linear layer's parameters: y = x W^T (+ b), W (out, in). In bf16 mode `weight_bf16` is the
// compute copy of W (refreshed from the fp32 master after each optimizer step). A frozen W
// (requires_grad false) gets no gradient; frozen in bf16, `weight` holds the bf16 values too.
struct Linear {
  Var weight;
  Var bias;            // may be null
  Tensor weight_bf16;  // undefined in fp32 mode
};

// cos/sin of every position for one head_dim, (max_positions, head_dim / 2), computed as HF does.
struct RopeTable {
  Tensor cos, sin;
  int64_t head_dim = 0;
  // cos/sin of position * inv_freq (head_dim / 2 frequencies), times attention_scaling.
  static RopeTable make(const std::vector<float>& inv_freq, float attention_scaling, int64_t max_positions);
  // The unscaled frequencies, inv_freq_j = 1 / theta^(2j / head_dim) in fp32 (as transformers).
  static std::vector<float> default_inv_freq(int64_t head_dim, double theta);
};

// out[i] = table[ids[i] - first]: the table holds the ids [first, first + rows) -- the whole
// vocabulary, or a tensor-parallel rank's slice, whose other ids give zero rows.
Var embedding(Tape& tape, const Tensor& ids, const Var& table, int64_t first = 0);
Var rmsnorm(Tape& tape, const Var& x, const Var& weight, float eps);
Var linear(Tape& tape, const Var& x, const Linear& layer, GemmKind kind = GemmKind::standard);
Var add(Tape& tape, const Var& a, const Var& b);
// Splits x (rows, sum(widths)) into contiguous column blocks.
std::vector<Var> split_columns(Tape& tape, const Var& x, const std::vector<int64_t>& widths);
// x (rows, heads * d); positions (rows) i64.
Var rope(Tape& tape, const Var& x, const Tensor& positions, const RopeTable& table, int64_t heads);
// doc_start: (B, T) i32 document mask of packed rows (see AttentionShape), or undefined (causal).
Var attention(Tape& tape, const Var& q, const Var& k, const Var& v, const AttentionShape& shape,
              const Tensor& doc_start = Tensor());
// attention() whose output is the decode kernel's (attention_decode: each query alone over its
// keys 0..t in order, generation's sums), so a pass over whole rows gives what the rollout engine
// computed for them bit for bit. Plain causal rows only (no doc_start). The backward is the flash
// one, on the log-sum-exp of a flash forward run beside it (only when the tape records).
Var attention_in_decode_order(Tape& tape, const Var& q, const Var& k, const Var& v, const AttentionShape& shape);
Var swiglu(Tape& tape, const Var& gate_up, int64_t intermediate);

// Output head and cross-entropy fused and chunked over rows: never holds more than one chunk of
// (rows, vocab) logits. Returns the sum of the token losses; the gradients of
// loss_scale * (that sum) reach `hidden` and the head's weight.
double lm_head_cross_entropy(Tape& tape, const Var& hidden, const Linear& head, const Tensor& labels,
                             float loss_scale, int64_t chunk_rows = 1024);
// Plain logits (rows, vocab) for evaluation and generation.
Tensor lm_head_logits(const Var& hidden, const Linear& head, GemmKind kind = GemmKind::standard);

}  // namespace fab
