#include "nn/vision_ops.h"

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/profiler.h"
#include "kernels/cpu/vision_kernels.h"

namespace fab {
namespace {

Tensor new_activation(Shape shape) { return Tensor::empty(std::move(shape), DType::f32, MemoryCategory::activations); }

void check_host(const Var& x, const char* op) {
  FAB_CHECK(x->value.device().is_host(), "{}: the vision tower's ops run on the CPU", op);
}

// An elementwise activation y = f(x) with dx += f'(x) dy.
template <typename Forward, typename Backward>
Var elementwise(Tape& tape, const Var& x, const char* name, Forward forward, Backward backward) {
  ProfileScope profile(name);
  check_host(x, name);
  Var y = make_var(new_activation(x->value.shape()));
  forward(x->value.data<float>(), y->value.data<float>(), x->value.numel());
  if (!x->requires_grad) return y;
  tape.push([x, y, backward] {
    backward(x->value.data<float>(), grad_of(y).data<float>(), grad_of(x).data<float>(), x->value.numel());
  });
  return y;
}

}  // namespace

RopeTable rope_table_of(int64_t rows, int64_t half, float attention_scaling, MemoryCategory category,
                        const std::function<float(int64_t row, int64_t pair)>& angle) {
  RopeTable t;
  t.head_dim = 2 * half;
  t.cos = Tensor::empty({rows, half}, DType::f32, category);
  t.sin = Tensor::empty({rows, half}, DType::f32, category);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t p = 0; p < half; ++p) {
      const float a = angle(r, p);
      t.cos.data<float>()[r * half + p] = std::cos(a) * attention_scaling;
      t.sin.data<float>()[r * half + p] = std::sin(a) * attention_scaling;
    }
  return t;
}

Var layernorm(Tape& tape, const Var& x, const Var& weight, const Var& bias, float eps) {
  ProfileScope profile("layernorm");
  check_host(x, "layernorm");
  const int64_t c = weight->value.numel(), rows = x->value.numel() / c;
  Var y = make_var(new_activation(x->value.shape()));
  Tensor mean = new_activation({rows}), rstd = new_activation({rows});
  vision_kernels::layernorm_forward(x->value.data<float>(), weight->value.data<float>(),
                                    bias ? bias->value.data<float>() : nullptr, rows, c, eps, y->value.data<float>(),
                                    mean.data<float>(), rstd.data<float>());
  tape.push([x, weight, bias, y, mean, rstd, rows, c] {
    ProfileScope profile("layernorm backward");
    float* dw = weight->requires_grad ? grad_of(weight).data<float>() : nullptr;
    float* db = bias && bias->requires_grad ? grad_of(bias).data<float>() : nullptr;
    vision_kernels::layernorm_backward(x->value.data<float>(), weight->value.data<float>(), mean.data<float>(),
                                       rstd.data<float>(), grad_of(y).data<float>(), rows, c,
                                       x->requires_grad ? grad_of(x).data<float>() : nullptr, dw, db);
  });
  return y;
}

Var quick_gelu(Tape& tape, const Var& x) {
  return elementwise(tape, x, "quick_gelu", vision_kernels::quick_gelu_forward, vision_kernels::quick_gelu_backward);
}

Var gelu(Tape& tape, const Var& x) {
  return elementwise(tape, x, "gelu", vision_kernels::gelu_forward, vision_kernels::gelu_backward);
}

Var segment_attention(Tape& tape, const Var& q, const Var& k, const Var& v, const std::vector<int64_t>& bounds,
                      int64_t heads, float scale) {
  ProfileScope profile("segment_attention");
  check_host(q, "segment_attention");
  const int64_t rows = q->value.dim(0), d = q->value.dim(1) / heads;
  FAB_CHECK(bounds.size() >= 2 && bounds.front() == 0 && bounds.back() == rows,
            "segment_attention: segments must cover the {} rows", rows);
  Var out = make_var(new_activation({rows, heads * d}));
  Tensor lse = new_activation({heads, rows});
  vision_kernels::segment_attention_forward(q->value.data<float>(), k->value.data<float>(), v->value.data<float>(),
                                            bounds, heads, d, scale, out->value.data<float>(), lse.data<float>());
  tape.push([q, k, v, out, lse, bounds, heads, d, scale] {
    ProfileScope profile("segment_attention backward");
    vision_kernels::segment_attention_backward(q->value.data<float>(), k->value.data<float>(),
                                               v->value.data<float>(), out->value.data<float>(), lse.data<float>(),
                                               grad_of(out).data<float>(), bounds, heads, d, scale,
                                               grad_of(q).data<float>(), grad_of(k).data<float>(),
                                               grad_of(v).data<float>());
  });
  return out;
}

Var reshape(Tape& tape, const Var& x, Shape shape) {
  Var out = make_var(x->value.reshape(std::move(shape)), x->requires_grad);
  if (!x->requires_grad) return out;
  tape.push([x, out] {
    const float* g = grad_of(out).data<float>();
    float* dx = grad_of(x).data<float>();
    for (int64_t i = 0; i < x->value.numel(); ++i) dx[i] += g[i];
  });
  return out;
}

Var scatter_rows(Tape& tape, const Var& base, const std::vector<int64_t>& rows, const Var& src) {
  ProfileScope profile("scatter_rows");
  check_host(base, "scatter_rows");
  const int64_t c = base->value.dim(-1), n = int64_t(rows.size()), total = base->value.numel() / c;
  FAB_CHECK(src->value.numel() == n * c, "scatter_rows: {} rows of {} features, got {} values", n, c,
            src->value.numel());
  Var out = make_var(new_activation(base->value.shape()));
  std::memcpy(out->value.data<float>(), base->value.data<float>(), size_t(total * c) * sizeof(float));
  for (int64_t j = 0; j < n; ++j) {
    FAB_CHECK(rows[size_t(j)] >= 0 && rows[size_t(j)] < total, "scatter_rows: row {} of {}", rows[size_t(j)], total);
    std::memcpy(out->value.data<float>() + rows[size_t(j)] * c, src->value.data<float>() + j * c,
                size_t(c) * sizeof(float));
  }
  tape.push([base, rows, src, out, c, total] {
    ProfileScope profile("scatter_rows backward");
    const float* g = grad_of(out).data<float>();
    std::vector<char> replaced(size_t(total), 0);
    for (int64_t r : rows) replaced[size_t(r)] = 1;
    if (src->requires_grad) {
      float* ds = grad_of(src).data<float>();
      for (size_t j = 0; j < rows.size(); ++j)
        for (int64_t e = 0; e < c; ++e) ds[int64_t(j) * c + e] += g[rows[j] * c + e];
    }
    if (!base->requires_grad) return;
    float* db = grad_of(base).data<float>();
    for (int64_t r = 0; r < total; ++r)
      if (!replaced[size_t(r)])
        for (int64_t e = 0; e < c; ++e) db[r * c + e] += g[r * c + e];
  });
  return out;
}

}  // namespace fab
