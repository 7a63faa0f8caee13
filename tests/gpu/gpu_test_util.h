#pragma once
// Helpers of the GPU tests: random host tensors, copies to and from the CUDA device, and the
// scaled-error comparison of tests/test_util.h. Every CUDA kernel is checked against the CPU
// kernel (the reference semantics) on the same inputs.
#include <gtest/gtest.h>

#include <vector>

#include "core/backend.h"
#include "core/error.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "kernels/kernel_table.h"
#include "test_util.h"

namespace fab::test {

inline const KernelTable& cpu_table() { return backend(DeviceKind::cpu).kernels(); }
inline const KernelTable& gpu_table() { return backend(DeviceKind::cuda).kernels(); }

inline Tensor host_tensor(Shape shape, DType dtype = DType::f32) {
  return Tensor::empty(std::move(shape), dtype, MemoryCategory::temporaries);
}

// N(0, std) values, or uniform integers in [lo, hi) for i32/i64.
inline Tensor random_tensor(Shape shape, uint64_t seed, double std = 1.0) {
  Tensor t = host_tensor(std::move(shape));
  Rng rng(seed);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = float(rng.normal() * std);
  return t;
}

inline Tensor to_device(const Tensor& host) {
  Tensor d = Tensor::empty(host.shape(), host.dtype(), MemoryCategory::temporaries, Device::cuda(0));
  d.copy_from(host);
  return d;
}

inline Tensor to_host(const Tensor& device) {
  Tensor h = host_tensor(device.shape(), device.dtype());
  h.copy_from(device);
  return h;
}

inline Tensor ids_tensor(const std::vector<int64_t>& values) {
  Tensor t = host_tensor({int64_t(values.size())}, DType::i64);
  for (size_t i = 0; i < values.size(); ++i) t.data<int64_t>()[i] = values[i];
  return t;
}

// The device result, fetched, within `tolerance` (scaled error) of the CPU result.
inline void expect_device_close(const Tensor& device, const Tensor& cpu, double tolerance, const std::string& what) {
  expect_close(to_host(device), cpu, tolerance, what);
}

}  // namespace fab::test
