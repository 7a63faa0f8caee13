#pragma once
// A Llama-style decoder assembled from nn/ops on any device: embedding, per layer RMSNorm, fused
// QKV, RoPE, causal GQA attention, o_proj, RMSNorm, fused gate/up, SwiGLU, down; final RMSNorm
// and the chunked lm_head cross-entropy; flat parameter / gradient / AdamW buffers; bf16 mode as
// the real model's (fp32 master weights, bf16 compute copies). The ops pick their kernels by the
// device of their tensors, so the same code runs on the CPU and on CUDA. Used by the GPU tests
// (CPU vs CUDA) and bench/gpu_bench.cpp, because models/DecoderModel is still CPU-only (its
// ParamBuffer is host page mappings; RoPE table, labels and positions are built on the host).
#include <cmath>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "nn/ops.h"

namespace fab::test {

struct OpsDecoderConfig {
  int64_t vocab = 64, hidden = 64, heads = 4, kv_heads = 2, head_dim = 16, intermediate = 96, layers = 2;
  int64_t batch = 2, seq = 32;
  int64_t ce_chunk_rows = 24;
  double init_std = 0.05;
};

class OpsDecoder {
 public:
  OpsDecoder(const OpsDecoderConfig& c, Device device, bool use_bf16) : c_(c), device_(device), bf16_(use_bf16) {
    const int64_t C = c.hidden, D = c.head_dim, qkv = (c.heads + 2 * c.kv_heads) * D;
    add_param("embed", {c.vocab, C});
    for (int64_t l = 0; l < c.layers; ++l) {
      add_param("in_norm", {C}), add_param("qkv", {qkv, C}), add_param("o", {C, c.heads * D});
      add_param("post_norm", {C}), add_param("gate_up", {2 * c.intermediate, C}), add_param("down", {C, c.intermediate});
    }
    add_param("final_norm", {C}), add_param("head", {c.vocab, C});
    values_ = Tensor::empty({total_}, DType::f32, MemoryCategory::parameters, device);
    values_.copy_from(initial_values());
    grads_ = Tensor::zeros({total_}, DType::f32, MemoryCategory::gradients, device);
    m_ = Tensor::zeros({total_}, DType::f32, MemoryCategory::optimizer_state, device);
    v_ = Tensor::zeros({total_}, DType::f32, MemoryCategory::optimizer_state, device);
    if (use_bf16) {
      values_bf16_ = Tensor::empty({total_}, DType::bf16, MemoryCategory::parameters, device);
      kernels().to_bf16(values_.data<float>(), values_bf16_.data<bf16>(), total_);
    }
    RopeTable host_rope = RopeTable::make(RopeTable::default_inv_freq(D, 10000.0), 1.0f, c.seq);
    rope_ = {on_device(host_rope.cos), on_device(host_rope.sin), D};
  }

  int64_t num_parameters() const { return counted_; }

  // ids, labels (already shifted: labels[t] is the target of position t, -100 ignored) and
  // positions: (B * T) i64 on the model's device. Returns the sum of token losses; the gradients
  // of loss_scale * that sum accumulate in the gradient buffer.
  double forward_backward(const Tensor& ids, const Tensor& labels, const Tensor& positions, float loss_scale) {
    Tape tape;
    size_t next = 0;
    Var x = embedding(tape, ids, var(next++));
    const float eps = 1e-6f;
    const int64_t H = c_.heads, KV = c_.kv_heads, D = c_.head_dim;
    for (int64_t l = 0; l < c_.layers; ++l) {
      Var in_norm = var(next++);
      Linear qkv = linear_of(next++), o = linear_of(next++);
      Var post_norm = var(next++);
      Linear gate_up = linear_of(next++), down = linear_of(next++);
      std::vector<Var> parts =
          split_columns(tape, linear(tape, rmsnorm(tape, x, in_norm, eps), qkv), {H * D, KV * D, KV * D});
      Var q = rope(tape, parts[0], positions, rope_, H), k = rope(tape, parts[1], positions, rope_, KV);
      const AttentionShape shape{c_.batch, c_.seq, H, KV, D, float(1.0 / std::sqrt(double(D))), nullptr, bf16_};
      Var x2 = fab::add(tape, x, linear(tape, attention(tape, q, k, parts[2], shape), o));
      Var h = swiglu(tape, linear(tape, rmsnorm(tape, x2, post_norm, eps), gate_up), c_.intermediate);
      x = fab::add(tape, x2, linear(tape, h, down));
    }
    Var hidden = rmsnorm(tape, x, var(next++), eps);
    const double loss = lm_head_cross_entropy(tape, hidden, linear_of(next++), labels, loss_scale, c_.ce_chunk_rows);
    tape.backward();
    return loss;
  }

  // AdamW (weight decay on matrices only), refreshing the bf16 copy, then zeroes the gradients.
  void step(int64_t t, float lr) {
    for (const Param& p : params_) {
      const AdamWArgs args{lr, 0.9f, 0.95f, 1e-8f, p.shape.size() >= 2 ? 0.1f : 0.0f, t};
      kernels().adamw_step(values_.data<float>() + p.offset, grads_.data<float>() + p.offset,
                           m_.data<float>() + p.offset, v_.data<float>() + p.offset, shape_numel(p.shape), args,
                           bf16_ ? values_bf16_.data<bf16>() + p.offset : nullptr);
    }
    grads_.zero_();
  }

  double grad_norm() const { return std::sqrt(kernels().sum_squares(grads_.data<float>(), total_)); }

  Tensor on_device(const Tensor& host) const {
    Tensor t = Tensor::empty(host.shape(), host.dtype(), MemoryCategory::parameters, device_);
    t.copy_from(host);
    return t;
  }

 private:
  struct Param {
    std::string name;
    Shape shape;
    int64_t offset;
  };
  const KernelTable& kernels() const { return backend(device_.kind).kernels(); }
  void add_param(const std::string& name, Shape shape) {
    params_.push_back({name, shape, total_});
    counted_ += shape_numel(shape);
    total_ += (shape_numel(shape) + 15) / 16 * 16;  // 64-byte aligned views
  }
  // Norm weights 1, the rest N(0, init_std) from one seeded stream per parameter (fast enough
  // for a 1B model: the streams run in parallel).
  Tensor initial_values() const {
    Tensor init = Tensor::zeros({total_}, DType::f32, MemoryCategory::temporaries);
#pragma omp parallel for schedule(dynamic)
    for (size_t i = 0; i < params_.size(); ++i) {
      const Param& p = params_[i];
      const bool norm = p.name.find("norm") != std::string::npos;
      Rng rng(1234 + i);
      float* w = init.data<float>() + p.offset;
      for (int64_t j = 0; j < shape_numel(p.shape); ++j) w[j] = norm ? 1.0f : float(rng.normal() * c_.init_std);
    }
    return init;
  }
  Var var(size_t i) const {
    const Param& p = params_.at(i);
    Var v = make_var(values_.view(p.offset, p.shape));
    v->grad = grads_.view(p.offset, p.shape);
    return v;
  }
  Linear linear_of(size_t i) const {
    Linear l;
    l.weight = var(i);
    if (bf16_) l.weight_bf16 = values_bf16_.view(params_[i].offset, params_[i].shape);
    return l;
  }

  OpsDecoderConfig c_;
  Device device_;
  bool bf16_;
  std::vector<Param> params_;
  int64_t total_ = 0, counted_ = 0;
  Tensor values_, grads_, m_, v_, values_bf16_;
  RopeTable rope_;
};

struct TokenBatch {
  Tensor ids, labels, positions;  // (B * T) i64; labels shifted
  int64_t targets = 0;
};

// Random tokens; labels are the next token, -100 at each row's end and its first `masked` tokens.
inline TokenBatch random_batch(const OpsDecoderConfig& c, uint64_t seed, int64_t masked) {
  const int64_t n = c.batch * c.seq;
  TokenBatch b;
  for (Tensor* t : {&b.ids, &b.labels, &b.positions}) *t = Tensor::empty({n}, DType::i64, MemoryCategory::temporaries);
  Rng rng(seed);
  for (int64_t i = 0; i < n; ++i) b.ids.data<int64_t>()[i] = int64_t(rng.next_u64() % uint64_t(c.vocab));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = i % c.seq;
    const bool ignored = t == c.seq - 1 || t < masked;
    b.positions.data<int64_t>()[i] = t;
    b.labels.data<int64_t>()[i] = ignored ? -100 : b.ids.data<int64_t>()[i + 1];
    b.targets += !ignored;
  }
  return b;
}

inline TokenBatch batch_on(const TokenBatch& host, const OpsDecoder& model) {
  return {model.on_device(host.ids), model.on_device(host.labels), model.on_device(host.positions), host.targets};
}

}  // namespace fab::test
