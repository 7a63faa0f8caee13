#pragma once
// A Tensor is a typed, shaped, contiguous view into a Storage. Views share the storage, which is
// how the flat parameter and gradient buffers hand out one tensor per parameter: a view is an
// element offset and a shape, so data-parallel buckets and ZeRO shards are offsets too.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/device.h"
#include "core/dtype.h"

namespace fab {

using Shape = std::vector<int64_t>;
int64_t shape_numel(const Shape& shape);
std::string shape_str(const Shape& shape);

class Storage {
 public:
  // Memory owned by a backend's allocator, accounted under `category`.
  Storage(size_t bytes, MemoryCategory category, Device device);
  // Memory owned elsewhere (a memory-mapped file, say); `release` runs when the last view goes.
  Storage(void* data, size_t bytes, Device device, std::function<void()> release);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

 private:
  void* data_;
  size_t bytes_;
  Device device_;
  MemoryCategory category_ = MemoryCategory::temporaries;
  bool owned_ = true;
  std::function<void()> release_;
};

class Tensor {
 public:
  Tensor() = default;
  static Tensor empty(Shape shape, DType dtype, MemoryCategory category, Device device = Device::cpu());
  static Tensor zeros(Shape shape, DType dtype, MemoryCategory category, Device device = Device::cpu());
  static Tensor from_external(void* data, Shape shape, DType dtype, std::function<void()> release,
                              Device device = Device::cpu());

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int64_t dim(int i) const { return shape_.at(i < 0 ? shape_.size() + i : i); }
  int ndim() const { return int(shape_.size()); }
  int64_t numel() const { return shape_numel(shape_); }
  size_t bytes() const { return size_t(numel()) * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_->device(); }

  void* raw() const { return static_cast<char*>(storage_->data()) + offset_bytes_; }
  template <typename T>
  T* data() const { return static_cast<T*>(raw()); }

  // A view of `shape` starting `element_offset` elements into this tensor's data.
  Tensor view(int64_t element_offset, Shape shape) const;
  Tensor reshape(Shape shape) const { return view(0, std::move(shape)); }
  void zero_();
  void copy_from(const Tensor& src);
  Tensor clone(MemoryCategory category) const;
  // A copy on `device` (this tensor itself when it is already there).
  Tensor to(Device device, MemoryCategory category) const;

 private:
  std::shared_ptr<Storage> storage_;
  size_t offset_bytes_ = 0;
  Shape shape_;
  DType dtype_ = DType::f32;
};

}  // namespace fab
