#include "optim/adamw.h"

#include <algorithm>
#include <cmath>

#include "core/backend.h"
#include "core/profiler.h"
#include "kernels/kernel_table.h"

namespace fab {
namespace {

int64_t total_length(const std::vector<OptimizerSegment>& segments) {
  int64_t n = 0;
  for (const OptimizerSegment& s : segments) n += s.length;
  return n;
}

}  // namespace

std::vector<OptimizerSegment> whole_parameters(const ParamBuffer& params) {
  std::vector<OptimizerSegment> segments;
  for (size_t i = 0; i < params.params().size(); ++i) {
    const ParamInfo& p = params.params()[i];
    segments.push_back({i, 0, p.numel(), p.offset});
  }
  return segments;
}

AdamW::AdamW(ParamBuffer& params, const AdamWConfig& config)
    : AdamW(params, config, whole_parameters(params), params.grads().data<float>()) {}

AdamW::AdamW(ParamBuffer& params, const AdamWConfig& config, std::vector<OptimizerSegment> segments,
             const float* grads)
    : params_(params),
      config_(config),
      segments_(std::move(segments)),
      grads_(grads),
      m_(Tensor::zeros({total_length(segments_)}, DType::f32, MemoryCategory::optimizer_state, params.device())),
      v_(Tensor::zeros({total_length(segments_)}, DType::f32, MemoryCategory::optimizer_state, params.device())) {}

void AdamW::step(float lr) {
  ProfileScope profile("adamw");
  ++step_;
  const KernelTable& k = backend(params_.values().device().kind).kernels();
  float* values = params_.values().data<float>();
  int64_t state = 0;
  for (const OptimizerSegment& s : segments_) {
    const ParamInfo& info = params_.params()[s.param];
    const int64_t at = info.offset + s.begin;
    AdamWArgs args{lr, config_.beta1, config_.beta2, config_.eps, info.decays() ? config_.weight_decay : 0.0f, step_};
    bf16* compute_copy = params_.has_bf16() ? params_.bf16_values().data<bf16>() + at : nullptr;
    k.adamw_step(values + at, grads_ + s.grad_offset, m_.data<float>() + state, v_.data<float>() + state, s.length,
                 args, compute_copy);
    state += s.length;
  }
}

double clip_grad_norm(ParamBuffer& params, double max_norm) {
  ProfileScope profile("clip_grad_norm");
  const KernelTable& k = backend(params.grads().device().kind).kernels();
  Tensor& g = params.grads();
  const double norm = std::sqrt(k.sum_squares(g.data<float>(), g.numel()));
  const double coef = clip_coefficient(norm, max_norm);
  if (coef < 1.0) k.scale(g.data<float>(), g.numel(), float(coef));
  return norm;
}

double clip_coefficient(double norm, double max_norm) {
  if (max_norm <= 0) return 1.0;
  return std::min(1.0, max_norm / (norm + 1e-6));
}

}  // namespace fab
