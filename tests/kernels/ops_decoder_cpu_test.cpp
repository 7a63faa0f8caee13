// The ops-built decoder that the GPU tests and bench/gpu_bench.cpp run on CUDA
// (tests/gpu/ops_decoder.h), checked on the CPU where CI runs: it learns a repeated batch, in fp32
// and in bf16, and fp32 and bf16 start from the same loss.
#include <gtest/gtest.h>

#include <cstdio>

#include "gpu/ops_decoder.h"

namespace fab::test {
namespace {

std::vector<double> train_on_cpu(bool bf16, int steps) {
  const OpsDecoderConfig c;
  OpsDecoder model(c, Device::cpu(), bf16);
  const TokenBatch b = batch_on(random_batch(c, 99, 3), model);
  std::vector<double> losses;
  for (int t = 1; t <= steps; ++t) {
    losses.push_back(model.forward_backward(b.ids, b.labels, b.positions, float(1.0 / double(b.targets))) /
                     double(b.targets));
    model.step(t, 3e-3f);
  }
  return losses;
}

TEST(OpsDecoder, LearnsARepeatedBatchOnTheCpu) {
  const std::vector<double> fp32 = train_on_cpu(false, 15), bf16 = train_on_cpu(true, 15);
  EXPECT_NEAR(fp32.front(), std::log(64.0), 0.3) << "random init: about ln(vocab)";
  EXPECT_NEAR(bf16.front(), fp32.front(), 2e-2 * fp32.front());
  std::printf("  losses fp32 %.4f -> %.4f, bf16 %.4f -> %.4f\n", fp32.front(), fp32.back(), bf16.front(), bf16.back());
  EXPECT_LT(fp32.back(), 0.8 * fp32.front());
  EXPECT_LT(bf16.back(), 0.8 * bf16.front());
}

}  // namespace
}  // namespace fab::test
