// The CUDA memory-bound kernels (elementwise_kernels.cuh, norm_rope_kernels.cuh) compiled for the
// CPU with CUDA's built-ins emulated (cuda_emulation.h), against the CPU kernels: block
// reductions (cross-entropy, RMSNorm, sums), grid-stride loops on grids smaller than the data,
// column sums split over several slices with atomics, bf16 rounding, AdamW.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/rng.h"
#include "kernels/kernel_table.h"
#include "kernels/cuda_emulation.h"
// fabrica_core holds the real (CUDA) builds of these kernels under the same names: the emulated
// copies get namespaces of their own.
#define elementwise_kernels elementwise_kernels_emulated
#define norm_rope_kernels norm_rope_kernels_emulated
#include "kernels/cuda/elementwise_kernels.cuh"
#include "kernels/cuda/norm_rope_kernels.cuh"

namespace fab::test {
namespace {

namespace ek = fab::cuda::elementwise_kernels;
namespace nk = fab::cuda::norm_rope_kernels;

const KernelTable& cpu() { return *cpu_kernels_for_isa("avx2"); }

std::vector<float> randoms(size_t n, uint64_t seed, double std = 1.0) {
  std::vector<float> v(n);
  Rng rng(seed);
  for (float& x : v) x = float(rng.normal() * std);
  return v;
}

double scaled_diff(const std::vector<float>& got, const std::vector<float>& want) {
  double diff = 0, scale = 1e-30;
  for (size_t i = 0; i < got.size(); ++i) {
    diff = std::fmax(diff, std::fabs(double(got[i]) - double(want[i])));
    scale = std::fmax(scale, std::fabs(double(want[i])));
  }
  return diff / scale;
}

// LoRA's dropout: the CUDA mask is the CPU's bit for bit (the same counter-based draws), on a
// grid smaller than the data; the multiply it feeds is exact too.
TEST(CudaEmulation, DropoutMaskAndMultiplyEqualTheCpu) {
  const int64_t n = 10007;
  std::vector<float> mask(static_cast<size_t>(n)), emask(static_cast<size_t>(n));
  cpu().dropout_mask(mask.data(), n, 0x1234abcdull, 0.3, 1.0f / 0.7f);
  emulate(ek::dropout_mask_kernel, {3, 1, 1}, 128, emask.data(), n, uint64_t(0x1234abcdull), 0.3, 1.0f / 0.7f);
  EXPECT_EQ(emask, mask);
  int64_t kept = 0;
  for (float m : mask) kept += m != 0.0f;
  EXPECT_NEAR(double(kept) / double(n), 0.7, 0.02);
  const std::vector<float> x = randoms(static_cast<size_t>(n), 3);
  std::vector<float> out(static_cast<size_t>(n)), eout(static_cast<size_t>(n));
  cpu().multiply(x.data(), mask.data(), out.data(), n);
  emulate(ek::multiply_kernel, {2, 1, 1}, 64, x.data(), static_cast<const float*>(mask.data()), eout.data(), n);
  EXPECT_EQ(eout, out);
}

// Tensor parallel's vocabulary-slice cross-entropy passes: a block per row, against the CPU's.
TEST(CudaEmulation, VocabSliceCrossEntropyPassesEqualTheCpu) {
  const int64_t n = 4, slice = 300, valid = 291, begin = 1000;
  const std::vector<int64_t> labels{1005, -100, 1290, 77};  // in the slice, ignored, its last real id, elsewhere
  const std::vector<float> z = randoms(static_cast<size_t>(n * slice), 21, 3.0);
  std::vector<float> row_max(static_cast<size_t>(n)), erow_max = row_max;
  cpu().vocab_slice_max(z.data(), n, slice, valid, row_max.data());
  emulate(ek::vocab_slice_max_kernel, {unsigned(n), 1, 1}, 128, z.data(), slice, valid, erow_max.data());
  EXPECT_EQ(erow_max, row_max);
  for (float& m : row_max) m += 0.5f;  // as if another rank held a larger logit
  std::vector<float> a = z, b = z;
  std::vector<double> sums(static_cast<size_t>(2 * n)), esums = sums;
  cpu().vocab_slice_exp(a.data(), labels.data(), n, slice, valid, begin, row_max.data(), sums.data());
  emulate(ek::vocab_slice_exp_kernel, {unsigned(n), 1, 1}, 128, b.data(), labels.data(), n, slice, valid, begin,
          static_cast<const float*>(row_max.data()), esums.data());
  EXPECT_EQ(b, a);
  for (size_t i = 0; i < sums.size(); ++i) EXPECT_NEAR(esums[i], sums[i], 1e-12 * std::fabs(sums[i])) << i;
  EXPECT_EQ(sums[n + 0], double(z[5])) << "the target's logit, read before the exponentials";
  EXPECT_EQ(sums[n + 3], 0.0) << "a target another rank holds";
  cpu().vocab_slice_grad(a.data(), labels.data(), n, slice, valid, begin, sums.data(), 0.25f);
  emulate(ek::vocab_slice_grad_kernel, {unsigned(n), 1, 1}, 128, b.data(), labels.data(), slice, valid, begin,
          static_cast<const double*>(sums.data()), 0.25f);
  EXPECT_EQ(b, a);
  for (int64_t j = 0; j < slice; ++j) EXPECT_EQ(a[static_cast<size_t>(slice + j)], 0.0f) << "the ignored row";
  for (int64_t j = valid; j < slice; ++j) EXPECT_EQ(a[static_cast<size_t>(j)], 0.0f) << "padding";
}

TEST(CudaEmulation, CrossEntropyRowsAndLossSum) {
  const int64_t rows = 5, vocab = 1000;
  const float scale = 0.25f;
  const std::vector<int64_t> labels{3, -100, 999, 0, 517};
  const std::vector<float> logits = randoms(static_cast<size_t>(rows * vocab), 1, 3.0);
  for (bool bf16_grad : {false, true}) {
    std::vector<float> z = logits, ez = logits;
    std::vector<bf16> g(static_cast<size_t>(rows * vocab));
    std::vector<uint16_t> eg(static_cast<size_t>(rows * vocab));
    std::vector<double> row_loss(static_cast<size_t>(rows) + 1);
    const double loss = cpu().cross_entropy_chunk(z.data(), labels.data(), rows, vocab, scale,
                                                  bf16_grad ? g.data() : nullptr);
    emulate(ek::cross_entropy_kernel, {unsigned(rows), 1, 1}, 128, ez.data(), labels.data(), vocab, scale,
            bf16_grad ? eg.data() : static_cast<uint16_t*>(nullptr), row_loss.data());
    emulate(ek::sum_doubles_kernel, {1, 1, 1}, 64, static_cast<const double*>(row_loss.data()), rows,
            row_loss.data() + rows);
    EXPECT_NEAR(row_loss[static_cast<size_t>(rows)], loss, 1e-5 * loss);
    if (bf16_grad) {
      std::vector<float> got(eg.size()), want(eg.size());
      for (size_t j = 0; j < eg.size(); ++j) got[j] = to_f32(bf16{eg[j]}), want[j] = to_f32(g[j]);
      EXPECT_LE(scaled_diff(got, want), 1e-2);
    } else {
      EXPECT_LE(scaled_diff(ez, z), 1e-5);
    }
  }
}

TEST(CudaEmulation, RmsNormForwardAndBothGradients) {
  const int64_t rows = 6, c = 300;
  const auto x = randoms(static_cast<size_t>(rows * c), 2), w = randoms(static_cast<size_t>(c), 3), dy = randoms(static_cast<size_t>(rows * c), 4);
  std::vector<float> y(x.size()), rstd(static_cast<size_t>(rows)), ey(x.size()), erstd(static_cast<size_t>(rows));
  cpu().rmsnorm_forward(x.data(), w.data(), rows, c, 1e-5f, y.data(), rstd.data());
  emulate(nk::rmsnorm_forward_kernel, {unsigned(rows), 1, 1}, 96, x.data(), w.data(), c, 1e-5f, ey.data(),
          erstd.data());
  EXPECT_LE(scaled_diff(ey, y), 1e-5);
  EXPECT_LE(scaled_diff(erstd, rstd), 1e-5);
  std::vector<float> dx = randoms(x.size(), 5), dw = randoms(static_cast<size_t>(c), 6), edx = dx, edw = dw;
  cpu().rmsnorm_backward(x.data(), w.data(), rstd.data(), dy.data(), rows, c, dx.data(), dw.data());
  emulate(nk::rmsnorm_backward_dx_kernel, {unsigned(rows), 1, 1}, 64, x.data(), w.data(), rstd.data(), dy.data(), c,
          edx.data());
  // dw over 2 x 3 blocks of 64 columns: three row slices added by atomics.
  emulate(nk::rmsnorm_backward_dw_kernel, {5, 3, 1}, 64, x.data(), rstd.data(), dy.data(), rows, c, edw.data());
  EXPECT_LE(scaled_diff(edx, dx), 1e-5);
  EXPECT_LE(scaled_diff(edw, dw), 1e-5);
}

TEST(CudaEmulation, GridStrideKernelsAndColumnSums) {
  const int64_t rows = 7, n = 45, i = 45;  // more elements than the 2 x 64 emulated threads
  const auto a = randoms(static_cast<size_t>(rows * n), 7), gu = randoms(static_cast<size_t>(rows * 2 * i), 8), dh = randoms(static_cast<size_t>(rows * i), 9);
  std::vector<float> db = randoms(static_cast<size_t>(n), 10), edb = db;
  cpu().bias_backward(a.data(), rows, n, db.data());
  emulate(ek::column_sum_kernel, {1, 3, 1}, 64, a.data(), rows, n, edb.data());
  EXPECT_LE(scaled_diff(edb, db), 1e-6);
  for (bool accumulate : {false, true}) {
    std::vector<float> g = randoms(gu.size(), 11), eg = g;
    cpu().swiglu_backward(gu.data(), dh.data(), rows, i, g.data(), accumulate);
    emulate(ek::swiglu_backward_kernel, {2, 1, 1}, 64, gu.data(), dh.data(), rows, i, eg.data(), accumulate);
    EXPECT_LE(scaled_diff(eg, g), 1e-5) << "accumulate " << accumulate;
  }
  const std::vector<int64_t> ids{4, 1, 4, 0};
  std::vector<float> table = randoms(static_cast<size_t>(5 * n), 12), etable = table;
  cpu().embedding_backward(ids.data(), 4, a.data(), 0, 5, n, table.data());
  emulate(ek::embedding_backward_kernel, {2, 1, 1}, 64, ids.data(), int64_t(4), a.data(), int64_t(0), int64_t(5), n,
          etable.data());
  EXPECT_EQ(etable, table) << "the rows of each column added in the CPU kernel's order";
  // A tensor-parallel slice: rows [1, 4) of the vocabulary; ids 4 and 0 fall outside it.
  std::vector<float> slice(static_cast<size_t>(3 * n), 0.0f), eslice = slice, out(static_cast<size_t>(4 * n)), eout = out;
  cpu().embedding_backward(ids.data(), 4, a.data(), 1, 3, n, slice.data());
  emulate(ek::embedding_backward_kernel, {2, 1, 1}, 64, ids.data(), int64_t(4), a.data(), int64_t(1), int64_t(3), n,
          eslice.data());
  EXPECT_EQ(eslice, slice);
  for (int64_t j = 0; j < n; ++j) EXPECT_EQ(slice[static_cast<size_t>(j)], a[static_cast<size_t>(n + j)]);  // id 1
  cpu().embedding_forward(ids.data(), 4, table.data(), 1, 3, n, out.data());
  emulate(ek::embedding_forward_kernel, {2, 1, 1}, 64, ids.data(), int64_t(4), static_cast<const float*>(table.data()),
          int64_t(1), int64_t(3), n, eout.data());
  EXPECT_EQ(eout, out);
  EXPECT_EQ(out[0], 0.0f);  // id 4: another rank's row
  std::vector<double> partial(3);
  emulate(ek::sum_squares_kernel, {3, 1, 1}, 64, a.data(), rows * n, partial.data());
  EXPECT_NEAR(partial[0] + partial[1] + partial[2], cpu().sum_squares(a.data(), rows * n), 1e-4);
}

TEST(CudaEmulation, SamplingWeights) {
  const int64_t n = 3000;  // more than the block's 1024 threads
  std::vector<float> logits = randoms(static_cast<size_t>(n), 21, 4.0), weight(static_cast<size_t>(n)),
                     eweight = weight;
  std::vector<double> total(1);
  const double sum = cpu().sampling_weights(logits.data(), n, 1.0f / 0.7f, weight.data());
  emulate(ek::sampling_weights_kernel, {1, 1, 1}, 1024, static_cast<const float*>(logits.data()), n, 1.0f / 0.7f,
          eweight.data(), total.data());
  EXPECT_NEAR(total[0], sum, 1e-5 * sum);
  for (size_t i = 0; i < weight.size(); ++i) EXPECT_NEAR(eweight[i], weight[i], 1e-6f * (1 + weight[i])) << i;
}

TEST(CudaEmulation, AdamWAndBf16Copy) {
  const int64_t n = 200;
  std::vector<float> p = randoms(static_cast<size_t>(n), 13), g = randoms(static_cast<size_t>(n), 14), m = randoms(static_cast<size_t>(n), 15, 0.1);
  std::vector<float> v = randoms(static_cast<size_t>(n), 16, 0.1);
  for (float& x : v) x = std::fabs(x);
  std::vector<float> ep = p, em = m, ev = v;
  std::vector<bf16> pb(static_cast<size_t>(n));
  std::vector<uint16_t> epb(static_cast<size_t>(n));
  const AdamWArgs a{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 3};
  cpu().adamw_step(p.data(), g.data(), m.data(), v.data(), n, a, pb.data());
  // The host side of cuda::adamw_step: the same scalars as the CPU kernel computes.
  const float decay = float(1.0 - double(a.lr) * double(a.weight_decay));
  const float step_size = float(double(a.lr) / (1.0 - std::pow(double(a.beta1), double(a.step))));
  const float bc2_sqrt = float(std::sqrt(1.0 - std::pow(double(a.beta2), double(a.step))));
  emulate(ek::adamw_kernel, {2, 1, 1}, 64, ep.data(), static_cast<const float*>(g.data()), em.data(), ev.data(), n,
          decay, step_size, bc2_sqrt, a.beta2, 1.0f - a.beta1, 1.0f - a.beta2, a.eps, epb.data());
  EXPECT_LE(scaled_diff(ep, p), 1e-6);
  EXPECT_LE(scaled_diff(em, m), 1e-6);
  EXPECT_LE(scaled_diff(ev, v), 1e-6);
  int far = 0;
  for (int64_t j = 0; j < n; ++j) far += std::abs(int(epb[static_cast<size_t>(j)]) - int(pb[static_cast<size_t>(j)].bits)) > 1;
  EXPECT_EQ(far, 0);
}

}  // namespace
}  // namespace fab::test
