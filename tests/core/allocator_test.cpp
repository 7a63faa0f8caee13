#include <gtest/gtest.h>

#include "core/backend.h"
#include "core/error.h"
#include "core/tensor.h"

namespace fab {
namespace {

TEST(Allocator, TracksLiveAndPeakBytesPerCategory) {
  Allocator& a = backend(DeviceKind::cpu).allocator();
  a.reset_peaks();
  const size_t act0 = a.stats(MemoryCategory::activations).live;
  const size_t opt0 = a.stats(MemoryCategory::optimizer_state).live;
  {
    Tensor x = Tensor::empty({1000}, DType::f32, MemoryCategory::activations);
    Tensor y = Tensor::empty({10, 10}, DType::bf16, MemoryCategory::optimizer_state);
    EXPECT_EQ(a.stats(MemoryCategory::activations).live, act0 + 4000);
    EXPECT_EQ(a.stats(MemoryCategory::optimizer_state).live, opt0 + 200);
    Tensor view = x.view(10, {5, 2});  // views share storage: no new bytes
    EXPECT_EQ(a.stats(MemoryCategory::activations).live, act0 + 4000);
  }
  EXPECT_EQ(a.stats(MemoryCategory::activations).live, act0);
  EXPECT_EQ(a.stats(MemoryCategory::optimizer_state).live, opt0);
  EXPECT_GE(a.stats(MemoryCategory::activations).peak, act0 + 4000);
  a.reset_peaks();
  EXPECT_EQ(a.stats(MemoryCategory::activations).peak, act0);
}

TEST(Tensor, ViewsCheckBoundsAndShareData) {
  Tensor x = Tensor::zeros({4, 3}, DType::f32, MemoryCategory::temporaries);
  Tensor row = x.view(3, {3});
  row.data<float>()[1] = 5.0f;
  EXPECT_EQ(x.data<float>()[4], 5.0f);
  EXPECT_THROW(x.view(10, {3}), Error);
  Tensor copy = x.clone(MemoryCategory::temporaries);
  copy.data<float>()[4] = 1.0f;
  EXPECT_EQ(x.data<float>()[4], 5.0f);
}

// Without a usable GPU (the stub of a CPU-only build, or a CUDA build on a machine with no device)
// a CUDA tensor is a user error that says why.
TEST(Backend, CudaWithoutADeviceIsAUserError) {
  Backend& cuda = backend(DeviceKind::cuda);
  if (cuda.available()) GTEST_SKIP() << "a CUDA device is present (" << cuda.name() << ")";
  EXPECT_THROW(Tensor::empty({4}, DType::f32, MemoryCategory::temporaries, Device::cuda(0)), UserError);
}

}  // namespace
}  // namespace fab
