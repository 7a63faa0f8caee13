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

}  // namespace
}  // namespace fab::test
