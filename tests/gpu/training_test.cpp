// A short training run on the CUDA device against the same run on the CPU: the two-layer decoder
// of ops_decoder.h (built from nn/ops), fp32 and bf16 compute, 15 AdamW steps on one batch.
#include <cmath>

#include "gpu_test_util.h"
#include "ops_decoder.h"

namespace fab::test {
namespace {

std::vector<double> train(Device device, bool bf16, int steps) {
  const OpsDecoderConfig c;
  OpsDecoder model(c, device, bf16);
  const TokenBatch b = batch_on(random_batch(c, 99, 3), model);  // one batch, learnt by heart
  std::vector<double> losses;
  for (int t = 1; t <= steps; ++t) {
    const double sum = model.forward_backward(b.ids, b.labels, b.positions, float(1.0 / double(b.targets)));
    losses.push_back(sum / double(b.targets));
    EXPECT_TRUE(std::isfinite(model.grad_norm()));
    model.step(t, 3e-3f);
  }
  return losses;
}

void check_run(bool bf16, double tolerance) {
  const int steps = 15;
  const std::vector<double> cpu = train(Device::cpu(), bf16, steps), gpu = train(Device::cuda(0), bf16, steps);
  for (int t = 0; t < steps; ++t)
    EXPECT_NEAR(gpu[t], cpu[t], tolerance * cpu[t]) << (bf16 ? "bf16" : "fp32") << " loss at step " << t + 1;
  EXPECT_LT(gpu.back(), 0.8 * gpu.front()) << "the CUDA run learns the repeated batch";
  std::printf("  %s losses, cpu -> cuda: step 1 %.5f -> %.5f, step %d %.5f -> %.5f\n", bf16 ? "bf16" : "fp32", cpu[0],
              gpu[0], steps, cpu.back(), gpu.back());
}

TEST(CudaTraining, TinyDecoderFp32MatchesCpu) { check_run(false, 2e-3); }
TEST(CudaTraining, TinyDecoderBf16MatchesCpu) { check_run(true, 2e-2); }

TEST(CudaTraining, MemoryIsAccountedPerCategory) {
  Allocator& a = backend(DeviceKind::cuda).allocator();
  const size_t before = a.stats(MemoryCategory::optimizer_state).live;
  {
    Tensor t = Tensor::zeros({1 << 20}, DType::f32, MemoryCategory::optimizer_state, Device::cuda(0));
    EXPECT_EQ(a.stats(MemoryCategory::optimizer_state).live, before + (size_t(4) << 20));
    Tensor h = to_host(t);
    double sum = 0;
    for (int64_t i = 0; i < h.numel(); ++i) sum += std::fabs(h.data<float>()[i]);
    EXPECT_EQ(sum, 0.0) << "fill_zero";
  }
  EXPECT_EQ(a.stats(MemoryCategory::optimizer_state).live, before);
  EXPECT_GE(a.stats(MemoryCategory::optimizer_state).peak, before + (size_t(4) << 20));
}

// ZeRO-2/3's releasable buffers on CUDA (cuda_virtual_memory.h): decommitted granules are unmapped
// and uncounted, come back as zeros when committed, and a kernel runs on committed memory.
TEST(CudaTraining, ReleasableBuffersUnmapAndRemapGranules) {
  Backend& b = backend(DeviceKind::cuda);
  Allocator& a = b.allocator();
  const int64_t n = int64_t(24) << 20;  // 96 MiB of fp32: many 2 MiB granules
  const size_t before = a.stats(MemoryCategory::gradients).live;
  Tensor t = b.releasable_zeros(n, DType::f32, MemoryCategory::gradients);
  const size_t held = b.resident_bytes(t.raw(), t.bytes());
  EXPECT_GE(held, t.bytes());
  EXPECT_EQ(a.stats(MemoryCategory::gradients).live, before + held);
  b.kernels().scale(t.data<float>(), n, 2.0f);  // on zeros: still zeros
  Tensor ones = Tensor::empty({n}, DType::f32, MemoryCategory::temporaries);
  for (int64_t i = 0; i < n; ++i) ones.data<float>()[i] = 1.0f;
  t.copy_from(ones);
  // Decommit [1 MiB + 12 bytes, 81 MiB): the granules wholly inside go, the ends are zeroed.
  const int64_t first = (int64_t(1) << 18) + 3, last = int64_t(81) << 18;
  b.decommit(t.data<float>() + first, size_t(last - first) * 4);
  const size_t after = b.resident_bytes(t.raw(), t.bytes());
  EXPECT_LE(after + (size_t(78) << 20), held);
  EXPECT_EQ(a.stats(MemoryCategory::gradients).live, before + after);
  b.commit(t.data<float>() + first, size_t(last - first) * 4);
  EXPECT_EQ(b.resident_bytes(t.raw(), t.bytes()), held);
  b.kernels().scale(t.data<float>(), n, 3.0f);
  const Tensor h = to_host(t);
  for (int64_t i = 0; i < n; i += 4099)
    ASSERT_EQ(h.data<float>()[i], i >= first && i < last ? 0.0f : 3.0f) << i;
  t = Tensor();
  EXPECT_EQ(a.stats(MemoryCategory::gradients).live, before);
}

}  // namespace
}  // namespace fab::test
