// The rollout engine's decode GEMM (the KernelTable's decode_matmul, kernels/cpu/decode_kernels.cpp) on both ISA builds: C (+)= A B^T
// against a double-precision loop, f32 and bf16, over shapes with every kind of remainder; and
// each output the same bits whatever the row count or the threads, so a slot's logits never
// depend on its batch.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/rng.h"
#include "kernels/kernel_table.h"

namespace fab {
namespace {

struct Operands {
  std::vector<float> a, b;        // the values (bf16-representable when bf16)
  std::vector<bf16> a16, b16;
};

Operands random_operands(int64_t m, int64_t n, int64_t k, bool bf16_values, uint64_t seed) {
  Rng rng(seed);
  Operands o;
  auto fill = [&](std::vector<float>& v, std::vector<bf16>& v16, int64_t count) {
    for (int64_t i = 0; i < count; ++i) {
      const float x = float(rng.uniform() * 2.0 - 1.0);
      v16.push_back(to_bf16(x));
      v.push_back(bf16_values ? to_f32(v16.back()) : x);
    }
  };
  fill(o.a, o.a16, m * k);
  fill(o.b, o.b16, n * k);
  return o;
}

MatmulArgs args_of(const Operands& o, DType dtype, int64_t m, int64_t n, int64_t k, float* c, bool accumulate) {
  MatmulArgs x;
  x.a = dtype == DType::bf16 ? static_cast<const void*>(o.a16.data()) : o.a.data();
  x.b = dtype == DType::bf16 ? static_cast<const void*>(o.b16.data()) : o.b.data();
  x.c = c;
  x.m = m;
  x.n = n;
  x.k = k;
  x.trans_b = true;
  x.accumulate = accumulate;
  x.dtype = dtype;
  return x;
}

class DecodeMatmul : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    kernels_ = cpu_kernels_for_isa(GetParam());
    if (!kernels_) GTEST_SKIP() << "this CPU cannot run " << GetParam() << " [needs: " << GetParam() << "]";
  }
  const KernelTable* kernels_ = nullptr;
};

TEST_P(DecodeMatmul, MatchesADoubleReference) {
  for (DType dtype : {DType::f32, DType::bf16})
    for (int64_t m : {1, 3, 4, 9})
      for (int64_t n : {1, 5, 8, 33})
        for (int64_t k : {1, 7, 16, 40, 67})
          for (bool accumulate : {false, true}) {
            const Operands o = random_operands(m, n, k, dtype == DType::bf16, uint64_t(m * 1000 + n * 10 + k));
            std::vector<float> c(size_t(m * n), 0.5f);
            kernels_->decode_matmul(args_of(o, dtype, m, n, k, c.data(), accumulate));
            for (int64_t i = 0; i < m; ++i)
              for (int64_t j = 0; j < n; ++j) {
                double expected = accumulate ? 0.5 : 0.0;
                for (int64_t p = 0; p < k; ++p) expected += double(o.a[size_t(i * k + p)]) * o.b[size_t(j * k + p)];
                EXPECT_NEAR(c[size_t(i * n + j)], expected, 1e-5 * (1.0 + std::sqrt(double(k))))
                    << dtype_name(dtype) << " m " << m << " n " << n << " k " << k << " at " << i << ", " << j;
              }
          }
}

// Row i of a 9-row product equals the same row alone, and the product in one thread (inside a
// parallel region) equals the one split over the threads, bit for bit.
TEST_P(DecodeMatmul, EachOutputIsTheSameWhateverTheRowsOrThreads) {
  const int64_t m = 9, n = 37, k = 70;
  for (DType dtype : {DType::f32, DType::bf16}) {
    const Operands o = random_operands(m, n, k, dtype == DType::bf16, 3);
    std::vector<float> all(static_cast<size_t>(m * n)), nested(all.size()), alone(static_cast<size_t>(n));
    kernels_->decode_matmul(args_of(o, dtype, m, n, k, all.data(), false));
#pragma omp parallel num_threads(2)
    if (omp_get_thread_num() == 0) kernels_->decode_matmul(args_of(o, dtype, m, n, k, nested.data(), false));
    EXPECT_EQ(all, nested) << dtype_name(dtype);
    for (int64_t i = 0; i < m; ++i) {
      Operands row = o;
      row.a.assign(o.a.begin() + i * k, o.a.begin() + (i + 1) * k);
      row.a16.assign(o.a16.begin() + i * k, o.a16.begin() + (i + 1) * k);
      kernels_->decode_matmul(args_of(row, dtype, 1, n, k, alone.data(), false));
      EXPECT_EQ(std::vector<float>(all.begin() + i * n, all.begin() + (i + 1) * n), alone)
          << dtype_name(dtype) << " row " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Isa, DecodeMatmul, ::testing::Values("avx512", "avx2"));

}  // namespace
}  // namespace fab
