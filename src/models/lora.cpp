#include "models/lora.h"

#include <algorithm>
#include <cmath>

#include "core/backend.h"
#include "core/error.h"
#include "core/profiler.h"
#include "core/rng.h"
#include "kernels/counter_rng.h"
#include "kernels/kernel_table.h"
#include "nn/op_helpers.h"

namespace fab {
namespace {

Tensor activation(Shape shape, const Tensor& like) {
  return Tensor::empty(std::move(shape), DType::f32, MemoryCategory::activations, like.device());
}

// mask = keep / (1 - p), keep ~ Bernoulli(1 - p), drawn by a counter-based generator
// (kernels/counter_rng.h) from the pass's seed and the branch's stream: element i's draw depends
// only on (seed, stream, i), whatever the thread count or backend.
Tensor dropout_mask(int64_t n, const LoraPass& pass, uint64_t stream, const Tensor& like) {
  Tensor mask = activation({n}, like);
  const uint64_t key = counter_mix(pass.seed * 0x9e3779b97f4a7c15ull + stream);
  kernels_for(like).dropout_mask(mask.data<float>(), n, key, double(pass.dropout), 1.0f / (1.0f - pass.dropout));
  return mask;
}

}  // namespace

float LoraOptions::scaling() const {
  const double alpha_value = effective_alpha();
  return float(rslora ? alpha_value / std::sqrt(double(rank)) : alpha_value / double(rank));
}

const std::vector<std::string>& lora_projection_names() {
  static const std::vector<std::string> names = {"q_proj",  "k_proj",    "v_proj",   "o_proj",
                                                 "gate_proj", "up_proj", "down_proj", "shared_expert_gate"};
  return names;
}

std::vector<std::string> vision_lora_names(bool qwen2_5) {
  if (qwen2_5) return {"qkv", "proj", "gate_proj", "up_proj", "down_proj"};
  return {"qkv", "proj", "fc1", "fc2"};
}

void add_lora(Tape& tape, const Var& x, const Var& y, const std::vector<LoraBranch>& branches, const LoraPass& pass) {
  if (branches.empty()) return;
  ProfileScope profile("lora");
  const KernelTable& k = kernels_for(y->value);
  const int64_t rows = x->value.numel() / x->value.dim(-1), in = x->value.dim(-1), out = y->value.dim(-1);
  for (const LoraBranch& br : branches) {
    const int64_t r = br.a->value.dim(0), w = br.b->value.dim(0);
    FAB_CHECK(br.a->value.dim(1) == in && br.b->value.dim(1) == r && br.column + w <= out,
              "lora: A {} and B {} do not fit input width {} and output columns [{}, {}) of {}",
              shape_str(br.a->value.shape()), shape_str(br.b->value.shape()), in, br.column, br.column + w, out);
    Tensor mask, xd = x->value;
    if (pass.dropout > 0 && tape.recording()) {
      mask = dropout_mask(rows * in, pass, br.stream, x->value);
      xd = activation({rows, in}, x->value);
      k.multiply(x->value.data<float>(), mask.data<float>(), xd.data<float>(), rows * in);
    }
    Tensor us = activation({rows, r}, x->value), v = activation({rows, w}, x->value);
    gemm(k, xd, false, br.a->value, true, us.data<float>(), rows, r, in, false, pass.gemm);
    k.scale(us.data<float>(), rows * r, pass.scaling);
    gemm(k, us, false, br.b->value, true, v.data<float>(), rows, w, r, false, pass.gemm);
    k.copy_2d(v.data<float>(), w, y->value.data<float>() + br.column, out, rows, w, true);
    const float scaling = pass.scaling;
    tape.push([x, y, br, xd, us, mask, rows, in, out, r, w, scaling] {
      ProfileScope profile("lora backward");
      const KernelTable& k = kernels_for(us);
      Tensor dy = activation({rows, w}, us);  // this branch's columns of y's gradient
      k.copy_2d(grad_of(y).data<float>() + br.column, out, dy.data<float>(), w, rows, w, false);
      gemm(k, dy, true, us, false, grad_of(br.b).data<float>(), w, r, rows, true);
      Tensor du = activation({rows, r}, us);
      gemm(k, dy, false, br.b->value, false, du.data<float>(), rows, r, w, false);
      k.scale(du.data<float>(), rows * r, scaling);
      gemm(k, du, true, xd, false, grad_of(br.a).data<float>(), r, in, rows, true);
      if (!mask.defined()) {
        gemm(k, du, false, br.a->value, false, grad_of(x).data<float>(), rows, in, r, true);
        return;
      }
      Tensor dxd = activation({rows, in}, us);
      gemm(k, du, false, br.a->value, false, dxd.data<float>(), rows, in, r, false);
      k.multiply(dxd.data<float>(), mask.data<float>(), dxd.data<float>(), rows * in);
      k.accumulate(dxd.data<float>(), grad_of(x).data<float>(), rows * in);
    });
  }
}

void init_lora_a(float* a, int64_t rank, int64_t in, uint64_t seed) {
  // kaiming_uniform_ with a = sqrt(5): gain = sqrt(2 / (1 + 5)), bound = gain * sqrt(3 / fan_in) = 1 / sqrt(fan_in).
  const double bound = 1.0 / std::sqrt(double(in));
  Rng rng(seed);
  for (int64_t i = 0; i < rank * in; ++i) a[i] = float((2.0 * rng.uniform() - 1.0) * bound);
}

void merge_lora(float* w, const float* a, const float* b, int64_t out, int64_t in, int64_t rank, float scaling) {
  // As PEFT's merge: delta = (B A) * scaling, then W + delta.
  std::vector<float> delta(static_cast<size_t>(in));
  for (int64_t o = 0; o < out; ++o) {
    std::fill(delta.begin(), delta.end(), 0.0f);
    for (int64_t j = 0; j < rank; ++j)
      for (int64_t i = 0; i < in; ++i) delta[size_t(i)] += b[o * rank + j] * a[j * in + i];
    for (int64_t i = 0; i < in; ++i) w[o * in + i] += delta[size_t(i)] * scaling;
  }
}

}  // namespace fab
