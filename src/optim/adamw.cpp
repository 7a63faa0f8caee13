#include "optim/adamw.h"

#include <cmath>

#include "core/backend.h"
#include "core/profiler.h"
#include "kernels/kernel_table.h"

namespace fab {

AdamW::AdamW(ParamBuffer& params, const AdamWConfig& config)
    : params_(params),
      config_(config),
      m_(Tensor::zeros(params.values().shape(), DType::f32, MemoryCategory::optimizer_state)),
      v_(Tensor::zeros(params.values().shape(), DType::f32, MemoryCategory::optimizer_state)) {}

void AdamW::step(float lr) {
  ProfileScope profile("adamw");
  ++step_;
  const KernelTable& k = backend(params_.values().device().kind).kernels();
  float* p = params_.values().data<float>();
  const float* g = params_.grads().data<float>();
  for (const ParamInfo& info : params_.params()) {
    AdamWArgs args{lr, config_.beta1, config_.beta2, config_.eps, info.decays() ? config_.weight_decay : 0.0f, step_};
    bf16* compute_copy = params_.has_bf16() ? params_.bf16_values().data<bf16>() + info.offset : nullptr;
    k.adamw_step(p + info.offset, g + info.offset, m_.data<float>() + info.offset, v_.data<float>() + info.offset,
                 info.numel(), args, compute_copy);
  }
}

double clip_grad_norm(ParamBuffer& params, double max_norm) {
  ProfileScope profile("clip_grad_norm");
  const KernelTable& k = backend(params.grads().device().kind).kernels();
  Tensor& g = params.grads();
  const double norm = std::sqrt(k.sum_squares(g.data<float>(), g.numel()));
  if (max_norm > 0) {
    const double coef = max_norm / (norm + 1e-6);
    if (coef < 1.0) k.scale(g.data<float>(), g.numel(), float(coef));
  }
  return norm;
}

}  // namespace fab
