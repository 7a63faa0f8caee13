#include "core/tensor.h"

#include <cstring>

#include "core/backend.h"
#include "core/error.h"

namespace fab {

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string shape_str(const Shape& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + ")";
}

Storage::Storage(size_t bytes, MemoryCategory category, Device device)
    : bytes_(bytes), device_(device), category_(category) {
  data_ = backend(device.kind).allocator().allocate(bytes, category);
}

Storage::Storage(void* data, size_t bytes, Device device, std::function<void()> release)
    : data_(data), bytes_(bytes), device_(device), owned_(false), release_(std::move(release)) {}

Storage::~Storage() {
  if (owned_)
    backend(device_.kind).allocator().release(data_, bytes_, category_);
  else if (release_)
    release_();
}

Tensor Tensor::empty(Shape shape, DType dtype, MemoryCategory category, Device device) {
  Tensor t;
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  t.storage_ = std::make_shared<Storage>(size_t(shape_numel(t.shape_)) * dtype_size(dtype), category, device);
  return t;
}

Tensor Tensor::zeros(Shape shape, DType dtype, MemoryCategory category, Device device) {
  Tensor t = empty(std::move(shape), dtype, category, device);
  t.zero_();
  return t;
}

Tensor Tensor::from_external(void* data, Shape shape, DType dtype, std::function<void()> release, Device device) {
  Tensor t;
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  t.storage_ = std::make_shared<Storage>(data, t.bytes(), device, std::move(release));
  return t;
}

Tensor Tensor::view(int64_t element_offset, Shape shape) const {
  FAB_CHECK(defined(), "view of an undefined tensor");
  Tensor t = *this;
  t.offset_bytes_ += size_t(element_offset) * dtype_size(dtype_);
  t.shape_ = std::move(shape);
  FAB_CHECK(t.offset_bytes_ + t.bytes() <= storage_->bytes(), "view {} at offset {} runs past its storage",
            shape_str(t.shape_), element_offset);
  return t;
}

void Tensor::zero_() { backend(device().kind).fill_zero(raw(), bytes()); }

void Tensor::copy_from(const Tensor& src) {
  FAB_CHECK(src.dtype() == dtype_ && src.numel() == numel(), "copy_from: {} {} into {} {}", dtype_name(src.dtype()),
            shape_str(src.shape()), dtype_name(dtype_), shape_str(shape_));
  backend(device().kind).copy(raw(), device(), src.raw(), src.device(), bytes());
}

Tensor Tensor::clone(MemoryCategory category) const {
  Tensor t = empty(shape_, dtype_, category, device());
  t.copy_from(*this);
  return t;
}

Tensor Tensor::to(Device device, MemoryCategory category) const {
  if (!defined() || device == this->device()) return *this;
  Tensor t = empty(shape_, dtype_, category, device);
  t.copy_from(*this);
  return t;
}

}  // namespace fab
