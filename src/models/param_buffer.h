#pragma once
// All parameters of a model in one flat fp32 buffer, and their gradients in a second buffer of
// the same layout: a parameter is a name, a shape and an offset. Data-parallel buckets and ZeRO
// shards slice these buffers by offset; the optimizer walks them as a few long arrays.
#include <map>
#include <string>
#include <vector>

#include "autograd/tape.h"

namespace fab {

struct ParamInfo {
  std::string name;  // Hugging Face name, e.g. model.layers.0.self_attn.q_proj.weight
  Shape shape;
  int64_t offset = 0;  // in elements, into the flat buffers
  int64_t numel() const { return shape_numel(shape); }
  // torch/HF convention: weight decay only on tensors with >= 2 dimensions.
  bool decays() const { return shape.size() >= 2; }
};

class ParamBuffer {
 public:
  // Registers a parameter. `packed_after_previous` places it right after the previous one with no
  // alignment padding, so the two can be used as one fused matrix (q/k/v, gate/up).
  void add(const std::string& name, Shape shape, bool packed_after_previous = false);
  // Allocates the value and gradient buffers on `device` (on the host: zeroed page mappings
  // whose pages ZeRO can hand back to the OS); no add() after this.
  void allocate(bool with_bf16_copy, Device device = Device::cpu());
  // Frozen parameters instead: values only, no gradients, in fp32 and/or bf16 (a bf16-only
  // buffer keeps each weight once, as its compute copy). Their Vars do not require grad.
  void allocate_frozen(bool fp32_values, bool bf16_values, Device device = Device::cpu());
  Device device() const { return device_; }
  bool frozen() const { return !grads_.defined(); }

  const std::vector<ParamInfo>& params() const { return params_; }
  const ParamInfo& info(const std::string& name) const;
  bool contains(const std::string& name) const { return index_.count(name) != 0; }
  size_t index(const std::string& name) const { return index_.at(name); }  // into params()
  int64_t numel() const { return total_; }  // including alignment padding

  Var var(const std::string& name) const;
  // One Var spanning consecutive packed parameters, rows stacked: shape (sum of dim 0, dim 1...).
  // A frozen buffer's Var holds the fp32 values, or the bf16 ones when it has only those.
  Var fused(const std::vector<std::string>& names) const;
  Tensor bf16_view(const std::string& name) const;
  Tensor bf16_fused(const std::vector<std::string>& names) const;

  Tensor& values() { return values_; }
  Tensor& grads() { return grads_; }
  const Tensor& values() const { return values_; }
  const Tensor& grads() const { return grads_; }
  bool has_bf16() const { return values_bf16_.defined(); }
  bool has_fp32() const { return values_.defined(); }
  int64_t bytes() const;  // values, bf16 copy and gradients
  Tensor& bf16_values() { return values_bf16_; }
  // Parameter p's values from fp32 host memory `src`, into the fp32 values and the bf16 copy, as
  // the buffer has them (copied to the device when the buffer lives on one).
  void set_values(const ParamInfo& p, const float* src);
  // Parameter p's values in fp32 host memory: a view on the host, else a copy (widened from bf16
  // when the buffer holds only bf16).
  Tensor values_f32(const ParamInfo& p) const;
  void refresh_bf16();  // values_bf16 = bf16(values)
  void refresh_bf16(int64_t begin, int64_t end);  // the same for elements [begin, end)

 private:
  std::pair<int64_t, Shape> span(const std::vector<std::string>& names) const;
  std::vector<ParamInfo> params_;
  std::map<std::string, size_t> index_;
  int64_t total_ = 0;
  Device device_ = Device::cpu();
  Tensor values_, grads_, values_bf16_;
};

}  // namespace fab
