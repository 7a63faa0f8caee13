#pragma once
// torch.optim.AdamW over a ParamBuffer: decoupled weight decay on tensors with >= 2 dimensions
// only (HF/LLaMA-Factory's grouping), fp32 moments, fp32 master weights. It updates a list of
// segments (pieces of parameters): every parameter whole on one process, this rank's shard
// under ZeRO. The moments are stored compactly, segment after segment.
#include <vector>

#include "models/param_buffer.h"

namespace fab {

struct AdamWConfig {
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
};

// Elements [begin, begin + length) of parameter `param` (an index into ParamBuffer::params());
// its gradient is read at grad_offset of the gradient array the optimizer was given.
struct OptimizerSegment {
  size_t param = 0;
  int64_t begin = 0, length = 0;
  int64_t grad_offset = 0;
};

class AdamW {
 public:
  // Every parameter whole, gradients from params.grads().
  AdamW(ParamBuffer& params, const AdamWConfig& config);
  // Only `segments`, gradients from `grads` (which must outlive the optimizer).
  AdamW(ParamBuffer& params, const AdamWConfig& config, std::vector<OptimizerSegment> segments, const float* grads);
  // One update with learning rate `lr`. Also refreshes the bf16 compute copy of the updated
  // elements when the buffer has one.
  void step(float lr);
  int64_t steps_taken() const { return step_; }
  void set_steps_taken(int64_t steps) { step_ = steps; }  // when restoring a checkpoint
  const std::vector<OptimizerSegment>& segments() const { return segments_; }
  Tensor& exp_avg() { return m_; }
  Tensor& exp_avg_sq() { return v_; }
  const Tensor& exp_avg() const { return m_; }
  const Tensor& exp_avg_sq() const { return v_; }

 private:
  ParamBuffer& params_;
  AdamWConfig config_;
  std::vector<OptimizerSegment> segments_;
  const float* grads_;
  Tensor m_, v_;
  int64_t step_ = 0;
};

// Every parameter as one whole segment, gradients at the parameter's offset in the flat buffer.
std::vector<OptimizerSegment> whole_parameters(const ParamBuffer& params);

// Global L2 norm of all gradients; when it exceeds max_norm (> 0) the gradients are scaled by
// max_norm / (norm + 1e-6), as torch.nn.utils.clip_grad_norm_. Returns the norm before clipping.
double clip_grad_norm(ParamBuffer& params, double max_norm);

// The factor clip_grad_norm scales gradients of global norm `norm` by: max_norm / (norm + 1e-6)
// when that is below 1 and max_norm > 0, else 1.
double clip_coefficient(double norm, double max_norm);

}  // namespace fab
