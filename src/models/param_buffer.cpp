#include "models/param_buffer.h"

#include "core/backend.h"
#include "core/error.h"
#include "kernels/kernel_table.h"

namespace fab {

void ParamBuffer::add(const std::string& name, Shape shape, bool packed_after_previous) {
  FAB_CHECK(!values_.defined(), "parameter {} added after the buffers were allocated", name);
  FAB_CHECK(!index_.count(name), "parameter {} registered twice", name);
  constexpr int64_t kAlign = 16;  // elements: 64 bytes of fp32
  if (!packed_after_previous) total_ = (total_ + kAlign - 1) / kAlign * kAlign;
  ParamInfo p{name, std::move(shape), total_};
  total_ += p.numel();
  index_[name] = params_.size();
  params_.push_back(std::move(p));
}

namespace {

// Zeroed memory for a whole buffer, of which ZeRO-2/3 can hand parts back (Backend::decommit).
Tensor buffer_zeros(int64_t n, DType dtype, MemoryCategory category, Device device) {
  return backend(device.kind).releasable_zeros(n, dtype, category);
}

}  // namespace

void ParamBuffer::allocate(bool with_bf16_copy, Device device) {
  device_ = device;
  values_ = buffer_zeros(total_, DType::f32, MemoryCategory::parameters, device);
  grads_ = buffer_zeros(total_, DType::f32, MemoryCategory::gradients, device);
  if (with_bf16_copy) values_bf16_ = buffer_zeros(total_, DType::bf16, MemoryCategory::parameters, device);
}

void ParamBuffer::allocate_frozen(bool fp32_values, bool bf16_values, Device device) {
  FAB_CHECK(fp32_values || bf16_values, "frozen parameters need fp32 or bf16 values");
  device_ = device;
  if (fp32_values) values_ = buffer_zeros(total_, DType::f32, MemoryCategory::parameters, device);
  if (bf16_values) values_bf16_ = buffer_zeros(total_, DType::bf16, MemoryCategory::parameters, device);
}

int64_t ParamBuffer::bytes() const {
  int64_t n = 0;
  for (const Tensor* t : {&values_, &values_bf16_, &grads_})
    if (t->defined()) n += int64_t(t->bytes());
  return n;
}

const ParamInfo& ParamBuffer::info(const std::string& name) const {
  auto it = index_.find(name);
  FAB_CHECK(it != index_.end(), "no parameter named {}", name);
  return params_[it->second];
}

Var ParamBuffer::var(const std::string& name) const { return fused({name}); }

std::pair<int64_t, Shape> ParamBuffer::span(const std::vector<std::string>& names) const {
  const ParamInfo& first = info(names.front());
  Shape shape = first.shape;
  int64_t end = first.offset + first.numel();
  for (size_t i = 1; i < names.size(); ++i) {
    const ParamInfo& p = info(names[i]);
    FAB_CHECK(p.offset == end, "{} is not packed right after {}", p.name, names[i - 1]);
    FAB_CHECK(p.shape.size() == shape.size() && std::equal(p.shape.begin() + 1, p.shape.end(), shape.begin() + 1),
              "cannot fuse {} {} with {}", p.name, shape_str(p.shape), shape_str(shape));
    shape[0] += p.shape[0];
    end += p.numel();
  }
  return {first.offset, shape};
}

Tensor ParamBuffer::bf16_fused(const std::vector<std::string>& names) const {
  if (!values_bf16_.defined()) return Tensor();
  auto [offset, shape] = span(names);
  return values_bf16_.view(offset, shape);
}

Tensor ParamBuffer::bf16_view(const std::string& name) const { return bf16_fused({name}); }

Var ParamBuffer::fused(const std::vector<std::string>& names) const {
  FAB_CHECK(values_.defined() || values_bf16_.defined(), "parameters used before allocate()");
  auto [offset, shape] = span(names);
  if (frozen()) return make_var(values_.defined() ? values_.view(offset, shape) : values_bf16_.view(offset, shape), false);
  Var v = make_var(values_.view(offset, shape));
  v->grad = grads_.view(offset, shape);
  return v;
}

void ParamBuffer::set_values(const ParamInfo& p, const float* src) {
  const Tensor host = Tensor::from_external(const_cast<float*>(src), p.shape, DType::f32, nullptr);
  if (values_.defined()) values_.view(p.offset, p.shape).copy_from(host);
  if (!values_bf16_.defined()) return;
  Tensor narrowed = Tensor::empty(p.shape, DType::bf16, MemoryCategory::temporaries);
  backend(DeviceKind::cpu).kernels().to_bf16(src, narrowed.data<bf16>(), p.numel());
  values_bf16_.view(p.offset, p.shape).copy_from(narrowed);
}

Tensor ParamBuffer::values_f32(const ParamInfo& p) const {
  if (values_.defined()) return values_.view(p.offset, p.shape).to(Device::cpu(), MemoryCategory::temporaries);
  const Tensor narrow = values_bf16_.view(p.offset, p.shape).to(Device::cpu(), MemoryCategory::temporaries);
  Tensor out = Tensor::empty(p.shape, DType::f32, MemoryCategory::temporaries);
  for (int64_t i = 0; i < p.numel(); ++i) out.data<float>()[i] = to_f32(narrow.data<bf16>()[i]);
  return out;
}

void ParamBuffer::refresh_bf16() { refresh_bf16(0, total_); }

void ParamBuffer::refresh_bf16(int64_t begin, int64_t end) {
  if (!values_.defined() || !values_bf16_.defined()) return;
  backend(values_.device().kind).kernels().to_bf16(values_.data<float>() + begin, values_bf16_.data<bf16>() + begin,
                                                   end - begin);
}

}  // namespace fab
