#include "models/param_buffer.h"

#include "core/backend.h"
#include "core/error.h"
#include "core/pages.h"
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

void ParamBuffer::allocate(bool with_bf16_copy) {
  values_ = mapped_zeros(total_, DType::f32, MemoryCategory::parameters);
  grads_ = mapped_zeros(total_, DType::f32, MemoryCategory::gradients);
  if (with_bf16_copy) values_bf16_ = mapped_zeros(total_, DType::bf16, MemoryCategory::parameters);
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
  FAB_CHECK(values_.defined(), "parameters used before allocate()");
  auto [offset, shape] = span(names);
  Var v = make_var(values_.view(offset, shape));
  v->grad = grads_.view(offset, shape);
  return v;
}

void ParamBuffer::refresh_bf16() { refresh_bf16(0, total_); }

void ParamBuffer::refresh_bf16(int64_t begin, int64_t end) {
  backend(values_.device().kind).kernels().to_bf16(values_.data<float>() + begin, values_bf16_.data<bf16>() + begin,
                                                   end - begin);
}

}  // namespace fab
