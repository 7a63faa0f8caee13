#include "nn/ops.h"

#include <cmath>

#include "core/backend.h"
#include "core/error.h"
#include "core/profiler.h"
#include "nn/op_helpers.h"

namespace fab {
namespace {

Tensor new_activation(Shape shape, Device device, DType dtype = DType::f32) {
  return Tensor::empty(std::move(shape), dtype, MemoryCategory::activations, device);
}

}  // namespace

const KernelTable& kernels_for(const Tensor& t) { return backend(t.device().kind).kernels(); }

int64_t rows_of(const Tensor& x) { return x.numel() / x.dim(-1); }

Tensor to_bf16(const Tensor& x, MemoryCategory category) {
  Tensor out = Tensor::empty(x.shape(), DType::bf16, category, x.device());
  kernels_for(x).to_bf16(x.data<float>(), out.data<bf16>(), x.numel());
  return out;
}

void gemm(const KernelTable& k, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, float* c, int64_t m,
          int64_t n, int64_t kdim, bool accumulate, GemmKind kind) {
  MatmulArgs args;
  FAB_CHECK(a.dtype() == b.dtype(), "gemm: A is {} and B is {}", dtype_name(a.dtype()), dtype_name(b.dtype()));
  args.a = a.raw();
  args.b = b.raw();
  args.c = c;
  args.m = m;
  args.n = n;
  args.k = kdim;
  args.trans_a = trans_a;
  args.trans_b = trans_b;
  args.accumulate = accumulate;
  args.dtype = a.dtype();
  if (kind == GemmKind::standard) return k.matmul(args);
  FAB_CHECK(trans_b && !trans_a, "the decode GEMM takes A (M, K) and B stored (N, K)");
  k.decode_matmul(args);
}


std::vector<float> RopeTable::default_inv_freq(int64_t head_dim, double theta) {
  std::vector<float> f(size_t(head_dim / 2));
  for (int64_t j = 0; j < head_dim / 2; ++j)
    f[size_t(j)] = 1.0f / float(std::pow(theta, double(float(2 * j) / float(head_dim))));
  return f;
}

RopeTable RopeTable::make(const std::vector<float>& inv_freq, float attention_scaling, int64_t max_positions) {
  // As transformers: angle = pos * inv_freq in fp32; cos and sin times the attention scaling.
  const int64_t half = int64_t(inv_freq.size());
  RopeTable t;
  t.head_dim = 2 * half;
  t.cos = Tensor::empty({max_positions, half}, DType::f32, MemoryCategory::parameters);
  t.sin = Tensor::empty({max_positions, half}, DType::f32, MemoryCategory::parameters);
  for (int64_t j = 0; j < half; ++j)
    for (int64_t p = 0; p < max_positions; ++p) {
      const float angle = float(p) * inv_freq[size_t(j)];
      t.cos.data<float>()[p * half + j] = std::cos(angle) * attention_scaling;
      t.sin.data<float>()[p * half + j] = std::sin(angle) * attention_scaling;
    }
  return t;
}

Var embedding(Tape& tape, const Tensor& ids, const Var& table, int64_t first) {
  ProfileScope profile("embedding");
  const int64_t n = ids.numel(), rows = table->value.dim(0), c = table->value.dim(1);
  Var out = make_var(new_activation({n, c}, table->value.device()));
  kernels_for(table->value).embedding_forward(ids.data<int64_t>(), n, table->value.data<float>(), first, rows, c,
                                              out->value.data<float>());
  if (!table->requires_grad) return out;  // a frozen table: nothing to back-propagate into
  tape.push([ids, table, out, n, first, rows, c] {
    ProfileScope profile("embedding backward");
    kernels_for(ids).embedding_backward(ids.data<int64_t>(), n, grad_of(out).data<float>(), first, rows, c,
                                        grad_of(table).data<float>());
  });
  return out;
}

Var rmsnorm(Tape& tape, const Var& x, const Var& weight, float eps) {
  ProfileScope profile("rmsnorm");
  const int64_t c = weight->value.numel(), rows = x->value.numel() / c;
  Var out = make_var(new_activation(x->value.shape(), x->value.device()));
  Tensor rstd = new_activation({rows}, x->value.device());
  kernels_for(x->value).rmsnorm_forward(x->value.data<float>(), weight->value.data<float>(), rows, c, eps,
                                        out->value.data<float>(), rstd.data<float>());
  tape.push([x, weight, out, rstd, rows, c] {
    ProfileScope profile("rmsnorm backward");
    kernels_for(rstd).rmsnorm_backward(x->value.data<float>(), weight->value.data<float>(), rstd.data<float>(),
                                       grad_of(out).data<float>(), rows, c, grad_of(x).data<float>(),
                                       grad_of(weight).data<float>());
  });
  return out;
}

// y = x W^T + b:   dx += dy W;   dW += dy^T x;   db += sum_rows dy
Var linear(Tape& tape, const Var& x, const Linear& layer, GemmKind kind) {
  ProfileScope profile("linear");
  const Tensor& w = layer.weight->value;
  const int64_t rows = rows_of(x->value), in = w.dim(1), out_features = w.dim(0);
  FAB_CHECK(x->value.dim(-1) == in, "linear: input width {} but weight {}", x->value.dim(-1), shape_str(w.shape()));
  const KernelTable& k = kernels_for(w);
  const bool bf16 = layer.weight_bf16.defined();
  // In bf16 mode the saved input is the bf16 copy: half the activation memory.
  Tensor saved_x = bf16 ? to_bf16(x->value.reshape({rows, in}), MemoryCategory::activations) : x->value;
  const Tensor& w_compute = bf16 ? layer.weight_bf16 : w;
  Shape out_shape = x->value.shape();
  out_shape.back() = out_features;
  Var y = make_var(new_activation(out_shape, w.device()));
  gemm(k, saved_x, false, w_compute, true, y->value.data<float>(), rows, out_features, in, false, kind);
  if (layer.bias) k.add_bias(y->value.data<float>(), layer.bias->value.data<float>(), rows, out_features);
  tape.push([x, layer, y, saved_x, w_compute, rows, in, out_features, bf16] {
    ProfileScope profile("linear backward");
    const KernelTable& k = kernels_for(w_compute);
    Tensor dy = grad_of(y);
    if (layer.bias && layer.bias->requires_grad) k.bias_backward(dy.data<float>(), rows, out_features, grad_of(layer.bias).data<float>());
    Tensor dy_compute = bf16 ? to_bf16(dy, MemoryCategory::temporaries) : dy;
    if (x->requires_grad) {
      const GradTarget dx = grad_target(x);
      gemm(k, dy_compute, false, w_compute, false, dx.data, rows, in, out_features, dx.accumulate);
    }
    if (layer.weight->requires_grad)  // frozen weights (LoRA's base, freeze) get no gradient
      gemm(k, dy_compute, true, saved_x, false, grad_of(layer.weight).data<float>(), out_features, in, rows, true);
  });
  return y;
}

Var add(Tape& tape, const Var& a, const Var& b) {
  ProfileScope profile("add");
  Var out = make_var(new_activation(a->value.shape(), a->value.device()));
  kernels_for(a->value).add(a->value.data<float>(), b->value.data<float>(), out->value.data<float>(),
                            a->value.numel());
  tape.push([a, b, out] {
    ProfileScope profile("add backward");
    // d(a + b)/da = d(a + b)/db = 1. out is final once this runs, so when a has no gradient yet
    // it can take out's gradient tensor itself instead of a copy.
    const KernelTable& k = kernels_for(out->value);
    Tensor& g = grad_of(out);
    k.accumulate(g.data<float>(), grad_of(b).data<float>(), g.numel());
    if (a->grad.defined())
      k.accumulate(g.data<float>(), a->grad.data<float>(), g.numel());
    else
      a->grad = g;
  });
  return out;
}

std::vector<Var> split_columns(Tape& tape, const Var& x, const std::vector<int64_t>& widths) {
  ProfileScope profile("split_columns");
  const int64_t total = x->value.dim(-1), rows = rows_of(x->value);
  const KernelTable& k = kernels_for(x->value);
  std::vector<Var> parts;
  int64_t offset = 0;
  for (int64_t w : widths) {
    Var part = make_var(new_activation({rows, w}, x->value.device()));
    k.copy_2d(x->value.data<float>() + offset, total, part->value.data<float>(), w, rows, w, false);
    parts.push_back(part);
    offset += w;
  }
  FAB_CHECK(offset == total, "split_columns: widths sum to {} but the input has {} columns", offset, total);
  tape.push([x, parts, total, rows] {
    ProfileScope profile("split_columns backward");
    // The parts tile x's columns exactly: when each has a gradient, a fresh gradient of x is
    // overwritten everywhere, so it needs no zero-fill.
    const KernelTable& k = kernels_for(x->value);
    bool all = true;
    for (const Var& part : parts) all = all && part->grad.defined();
    const GradTarget dx = all ? grad_target(x) : GradTarget{grad_of(x).data<float>(), true};
    int64_t offset = 0;
    for (const Var& part : parts) {
      const int64_t w = part->value.dim(-1);
      if (part->grad.defined())
        k.copy_2d(part->grad.data<float>(), w, dx.data + offset, total, rows, w, dx.accumulate);
      offset += w;
    }
  });
  return parts;
}

Var rope(Tape& tape, const Var& x, const Tensor& positions, const RopeTable& table, int64_t heads) {
  ProfileScope profile("rope");
  const int64_t d = table.head_dim, rows = x->value.numel() / (heads * d);
  Var out = make_var(new_activation(x->value.shape(), x->value.device()));
  kernels_for(x->value).rope_forward(x->value.data<float>(), out->value.data<float>(), positions.data<int64_t>(),
                                     table.cos.data<float>(), table.sin.data<float>(), rows, heads, d);
  tape.push([x, out, positions, table, heads, d, rows] {
    ProfileScope profile("rope backward");
    kernels_for(out->value).rope_backward(grad_of(out).data<float>(), grad_of(x).data<float>(),
                                          positions.data<int64_t>(), table.cos.data<float>(),
                                          table.sin.data<float>(), rows, heads, d);
  });
  return out;
}

Var attention(Tape& tape, const Var& q, const Var& k, const Var& v, const AttentionShape& shape,
              const Tensor& doc_start) {
  ProfileScope profile("attention");
  FAB_CHECK(shape.heads % shape.kv_heads == 0, "attention: {} heads not a multiple of {} kv heads", shape.heads,
            shape.kv_heads);
  AttentionShape s = shape;
  if (doc_start.defined()) {
    FAB_CHECK(doc_start.dtype() == DType::i32 && doc_start.numel() == s.batch * s.seq,
              "attention: doc_start must be ({}, {}) i32", s.batch, s.seq);
    s.doc_start = doc_start.data<int32_t>();  // the closure below keeps doc_start alive
  }
  const Device dev = q->value.device();
  Var out = make_var(new_activation({s.batch * s.seq, s.heads * s.head_dim}, dev));
  Tensor lse = new_activation({s.batch, s.heads, s.seq}, dev);
  kernels_for(q->value).attention_forward(q->value.data<float>(), k->value.data<float>(), v->value.data<float>(), s,
                                          out->value.data<float>(), lse.data<float>());
  tape.push([q, k, v, out, lse, s, doc_start] {
    ProfileScope profile("attention backward");
    kernels_for(lse).attention_backward(q->value.data<float>(), k->value.data<float>(), v->value.data<float>(),
                                        out->value.data<float>(), lse.data<float>(), grad_of(out).data<float>(), s,
                                        grad_of(q).data<float>(), grad_of(k).data<float>(),
                                        grad_of(v).data<float>());
  });
  return out;
}

Var attention_in_decode_order(Tape& tape, const Var& q, const Var& k, const Var& v, const AttentionShape& shape) {
  FAB_CHECK(shape.doc_start == nullptr, "attention in decode order is plain causal");
  Var out = tape.recording() ? attention(tape, q, k, v, shape)
                             : make_var(new_activation({shape.batch * shape.seq, shape.heads * shape.head_dim},
                                                       q->value.device()));
  ProfileScope profile("attention in decode order");
  // The rows of each batch row are its own cache: (B, T, KVH, D), T positions each, none before.
  kernels_for(q->value).attention_decode(q->value.data<float>(), k->value.data<float>(), v->value.data<float>(), shape,
                                         0, shape.seq, out->value.data<float>());
  return out;
}

Var swiglu(Tape& tape, const Var& gate_up, int64_t intermediate) {
  ProfileScope profile("swiglu");
  const int64_t rows = rows_of(gate_up->value);
  Var h = make_var(new_activation({rows, intermediate}, gate_up->value.device()));
  kernels_for(h->value).swiglu_forward(gate_up->value.data<float>(), rows, intermediate, h->value.data<float>());
  tape.push([gate_up, h, rows, intermediate] {
    ProfileScope profile("swiglu backward");
    const GradTarget dgu = grad_target(gate_up);
    kernels_for(h->value).swiglu_backward(gate_up->value.data<float>(), grad_of(h).data<float>(), rows, intermediate,
                                          dgu.data, dgu.accumulate);
  });
  return h;
}

// Per chunk of rows: z = h W^T; CE turns z into dz = scale (softmax(z) - onehot) in place;
// dh = dz W;  dW += dz^T h. The weight gradient is accumulated right away; dh waits for backward.
double lm_head_cross_entropy(Tape& tape, const Var& hidden, const Linear& head, const Tensor& labels,
                             float loss_scale, int64_t chunk_rows) {
  ProfileScope profile("lm_head_cross_entropy");
  const Tensor& w = head.weight->value;
  const int64_t rows = rows_of(hidden->value), c = w.dim(1), vocab = w.dim(0);
  const KernelTable& k = kernels_for(w);
  const bool bf16 = head.weight_bf16.defined();
  const Tensor& w_compute = bf16 ? head.weight_bf16 : w;
  const Tensor h_compute = bf16 ? to_bf16(hidden->value.reshape({rows, c}), MemoryCategory::temporaries)
                                : hidden->value.reshape({rows, c});
  const bool need_grads = tape.recording();
  Tensor dh = need_grads ? Tensor::empty({rows, c}, DType::f32, MemoryCategory::activations, w.device()) : Tensor();
  chunk_rows = head_chunk_rows(chunk_rows, vocab, rows);
  Tensor logits = Tensor::empty({chunk_rows, vocab}, DType::f32, MemoryCategory::temporaries, w.device());
  // bf16 mode: the cross-entropy kernel writes the gradient straight in bf16 for the two GEMMs.
  Tensor dz_bf16 = bf16 && need_grads ? Tensor::empty({chunk_rows, vocab}, DType::bf16, MemoryCategory::temporaries,
                                                      w.device())
                                      : Tensor();
  double loss_sum = 0;
  for (int64_t r0 = 0; r0 < rows; r0 += chunk_rows) {
    const int64_t n = std::min(chunk_rows, rows - r0);
    const Tensor h_chunk = h_compute.view(r0 * c, {n, c});
    gemm(k, h_chunk, false, w_compute, true, logits.data<float>(), n, vocab, c, false);
    loss_sum += k.cross_entropy_chunk(logits.data<float>(), labels.data<int64_t>() + r0, n, vocab, loss_scale,
                                      dz_bf16.defined() ? dz_bf16.data<fab::bf16>() : nullptr);
    if (!need_grads) continue;
    const Tensor dz = bf16 ? dz_bf16.view(0, {n, vocab}) : logits.view(0, {n, vocab});
    gemm(k, dz, false, w_compute, false, dh.data<float>() + r0 * c, n, c, vocab, false);
    if (head.weight->requires_grad)
      gemm(k, dz, true, h_chunk, false, grad_of(head.weight).data<float>(), vocab, c, n, true);
  }
  tape.push([hidden, dh] {
    ProfileScope profile("lm_head_cross_entropy backward");
    kernels_for(dh).accumulate(dh.data<float>(), grad_of(hidden).data<float>(), dh.numel());
  });
  return loss_sum;
}

int64_t head_chunk_rows(int64_t requested, int64_t vocab, int64_t rows) {
  constexpr int64_t kBudgetBytes = int64_t(64) << 20, kFewest = 16;
  const int64_t fitting = std::max(kFewest, kBudgetBytes / (4 * std::max<int64_t>(vocab, 1)));
  return std::max<int64_t>(1, std::min({requested, fitting, rows}));
}

Tensor lm_head_logits(const Var& hidden, const Linear& head, GemmKind kind) {
  const Tensor& w = head.weight->value;
  const int64_t rows = rows_of(hidden->value), c = w.dim(1), vocab = w.dim(0);
  Tensor logits = Tensor::empty({rows, vocab}, DType::f32, MemoryCategory::activations, w.device());
  const bool bf16 = head.weight_bf16.defined();
  const Tensor h = bf16 ? to_bf16(hidden->value.reshape({rows, c}), MemoryCategory::temporaries)
                        : hidden->value.reshape({rows, c});
  gemm(kernels_for(w), h, false, bf16 ? head.weight_bf16 : w, true, logits.data<float>(), rows, vocab, c, false,
       kind);
  return logits;
}

}  // namespace fab
