#pragma once
// torch.optim.AdamW over a ParamBuffer: decoupled weight decay on tensors with >= 2 dimensions
// only (HF/LLaMA-Factory's grouping), fp32 moments, fp32 master weights.
#include "models/param_buffer.h"

namespace fab {

struct AdamWConfig {
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
};

class AdamW {
 public:
  AdamW(ParamBuffer& params, const AdamWConfig& config);
  // One update with learning rate `lr` from the gradients in params.grads(). Also refreshes the
  // bf16 compute copy of the weights when the buffer has one.
  void step(float lr);
  int64_t steps_taken() const { return step_; }
  void set_steps_taken(int64_t steps) { step_ = steps; }  // when restoring a checkpoint
  Tensor& exp_avg() { return m_; }
  Tensor& exp_avg_sq() { return v_; }
  const Tensor& exp_avg() const { return m_; }
  const Tensor& exp_avg_sq() const { return v_; }

 private:
  ParamBuffer& params_;
  AdamWConfig config_;
  Tensor m_, v_;
  int64_t step_ = 0;
};

// Global L2 norm of all gradients; when it exceeds max_norm (> 0) the gradients are scaled by
// max_norm / (norm + 1e-6), as torch.nn.utils.clip_grad_norm_. Returns the norm before clipping.
double clip_grad_norm(ParamBuffer& params, double max_norm);

}  // namespace fab
