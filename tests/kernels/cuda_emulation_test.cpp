// The CUDA attention kernels (src/kernels/cuda/attention_kernels.cuh) compiled for the CPU with
// CUDA's built-ins emulated (cuda_emulation.h): indexing, tiling, causal and document masking and
// the GQA mapping against the CPU kernels, where no GPU exists. The launch shapes copy attention.cu's.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "kernels/kernel_table.h"
#include "test_util.h"
#include "kernels/cuda_emulation.h"
#include "kernels/cuda/attention_kernels.cuh"  // its #pragma unroll: -Wno-unknown-pragmas (CMakeLists)

namespace fab::test {
namespace {

namespace ak = fab::cuda::attention_kernels;

// attention.cu's choice of template: head_dim rounded up to 32, 64 or 128, over P threads a row.
using KernelFn = void (*)(ak::Args);
KernelFn forward_for(int64_t d) {
  return d <= 32 ? ak::forward_kernel<8> : d <= 64 ? ak::forward_kernel<16> : ak::forward_kernel<32>;
}
KernelFn dq_for(int64_t d) { return d <= 32 ? ak::dq_kernel<8> : d <= 64 ? ak::dq_kernel<16> : ak::dq_kernel<32>; }
KernelFn dkdv_for(int64_t d) {
  return d <= 32 ? ak::dkdv_kernel<4> : d <= 64 ? ak::dkdv_kernel<8> : ak::dkdv_kernel<16>;
}

std::vector<float> randoms(int64_t n, uint64_t seed) {
  std::vector<float> v(static_cast<size_t>(n));
  Rng rng(seed);
  for (float& x : v) x = float(rng.normal());
  return v;
}

void expect_near_all(const std::vector<float>& got, const std::vector<float>& want, double tol, const std::string& what) {
  double diff = 0, scale = 1e-30;
  for (size_t i = 0; i < got.size(); ++i) {
    diff = std::fmax(diff, std::fabs(double(got[i]) - double(want[i])));
    scale = std::fmax(scale, std::fabs(double(want[i])));
  }
  EXPECT_LE(diff / scale, tol) << what;
}

struct Case {
  int64_t batch, seq, heads, kv_heads, head_dim;
  bool documents;
};

void check_case(const Case& c) {
  const std::string name = ::fab::format("B={} T={} H={} KVH={} D={} docs={}", c.batch, c.seq, c.heads, c.kv_heads,
                                         c.head_dim, c.documents);
  const int64_t rows = c.batch * c.seq, qn = rows * c.heads * c.head_dim, kn = rows * c.kv_heads * c.head_dim;
  const auto q = randoms(qn, 1), k = randoms(kn, 2), v = randoms(kn, 3), dout = randoms(qn, 4);
  std::vector<int32_t> doc(static_cast<size_t>(rows), 0);
  if (c.documents)
    for (int64_t b = 0; b < c.batch; ++b)
      for (int64_t t = 0, start = 0, len = 2 + b; t < c.seq; ++t) {
        if (t - start >= len) start = t, len += 5;
        doc[size_t(b * c.seq + t)] = int32_t(start);
      }
  AttentionShape s{c.batch, c.seq, c.heads, c.kv_heads, c.head_dim, float(1.0 / std::sqrt(double(c.head_dim)))};
  if (c.documents) s.doc_start = doc.data();
  const KernelTable& cpu = *cpu_kernels_for_isa("avx2");
  std::vector<float> out(static_cast<size_t>(qn)), lse(static_cast<size_t>(c.batch * c.heads * c.seq));
  cpu.attention_forward(q.data(), k.data(), v.data(), s, out.data(), lse.data());

  ak::Args a{};
  a.q = q.data(), a.k = k.data(), a.v = v.data(), a.doc = s.doc_start;
  a.tq = c.seq, a.kv_stride = c.seq, a.heads = c.heads, a.kv_heads = c.kv_heads, a.d = c.head_dim, a.scale = s.scale;
  std::vector<float> e_out(out.size()), e_lse(lse.size());
  a.o_write = e_out.data(), a.lse_write = e_lse.data();
  const unsigned qb = unsigned((c.seq + 63) / 64), kb = unsigned((c.seq + 31) / 32);
  emulate(forward_for(c.head_dim), {qb, unsigned(c.heads), unsigned(c.batch)}, 256, a);
  expect_near_all(e_out, out, 1e-5, name + " out");
  expect_near_all(e_lse, lse, 1e-5, name + " lse");

  std::vector<float> dq = randoms(qn, 5), dk = randoms(kn, 6), dv = randoms(kn, 7);
  std::vector<float> e_dq = dq, e_dk = dk, e_dv = dv, dvec(lse.size());
  cpu.attention_backward(q.data(), k.data(), v.data(), out.data(), lse.data(), dout.data(), s, dq.data(), dk.data(),
                         dv.data());
  a.out = out.data(), a.lse = lse.data(), a.dout = dout.data();
  a.dq = e_dq.data(), a.dk = e_dk.data(), a.dv = e_dv.data(), a.dvec = dvec.data();
  emulate(dq_for(c.head_dim), {qb, unsigned(c.heads), unsigned(c.batch)}, 256, a);
  emulate(dkdv_for(c.head_dim), {kb, unsigned(c.kv_heads), unsigned(c.batch)}, 256, a);
  expect_near_all(e_dq, dq, 1e-5, name + " dq");
  expect_near_all(e_dk, dk, 1e-5, name + " dk");
  expect_near_all(e_dv, dv, 1e-5, name + " dv");
}

TEST(CudaEmulation, AttentionKernelsMatchTheCpu) {
  check_case({1, 70, 4, 2, 64, false});  // two query blocks, three key tiles, GQA
  check_case({2, 45, 2, 1, 40, true});   // padded head_dim, MQA, document mask
  check_case({1, 33, 2, 2, 128, true});  // the widest head
  check_case({1, 20, 2, 1, 32, false});  // the narrowest width
}

TEST(CudaEmulation, AttentionDecodeMatchesTheCpu) {
  const int64_t batch = 2, heads = 4, kv_heads = 2, d = 64, past = 37, n = 3, capacity = 64;
  AttentionShape s{batch, n, heads, kv_heads, d, 0.125f};
  const auto q = randoms(batch * n * heads * d, 8), kc = randoms(batch * capacity * kv_heads * d, 9),
             vc = randoms(batch * capacity * kv_heads * d, 10);
  std::vector<float> out(q.size()), e_out(q.size());
  cpu_kernels_for_isa("avx2")->attention_decode(q.data(), kc.data(), vc.data(), s, past, capacity, out.data());
  ak::Args a{};
  a.q = q.data(), a.k = kc.data(), a.v = vc.data(), a.o_write = e_out.data();
  a.tq = n, a.kv_stride = capacity, a.heads = heads, a.kv_heads = kv_heads, a.d = d, a.pos0 = past, a.scale = 0.125f;
  emulate(forward_for(d), {1, unsigned(heads), unsigned(batch)}, 256, a);
  expect_near_all(e_out, out, 1e-5, "decode");
}

}  // namespace
}  // namespace fab::test
