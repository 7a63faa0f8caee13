// The CUDA attention kernels (src/kernels/cuda/attention_kernels.cuh, fp32, and
// attention_tc_kernels.cuh, bf16 on tensor cores) compiled for the CPU with CUDA's built-ins
// emulated (cuda_emulation.h): indexing, tiling, causal and document masking, the GQA mapping and
// the mma fragment layouts against the CPU kernels, where no GPU exists. The launch shapes copy
// attention.cu's.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "kernels/kernel_table.h"
#include "test_util.h"
#include "kernels/cuda_emulation.h"
#include "kernels/cuda/attention_kernels.cuh"  // its #pragma unroll: -Wno-unknown-pragmas (CMakeLists)
// fabrica_core holds the real (CUDA) build of its non-template kernel (row_dot_kernel) under the
// same name: the emulated copy gets a namespace of its own.
#define attention_tc attention_tc_emulated
#include "kernels/cuda/attention_tc_kernels.cuh"

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

// ---- bf16 tensor-core attention ------------------------------------------------------------------

namespace tc = fab::cuda::attention_tc;

float round_bf16(float x) { return to_f32(to_bf16(x)); }

// One warp: each lane packs its fragments of A (16 x 16) and B (16 x 8) by the PTX ISA layout of
// mma.m16n8k16 (written out again here, independently of the emulation), multiplies, and writes
// its fragment of D = C + A B back by the same layout.
void mma_layout_kernel(const float* A, const float* B, const float* C, float* D) {
  const int lane = int(threadIdx.x), group = lane / 4, quad = lane % 4;
  auto pair = [](float lo, float hi) { return tc::pack_bf16(lo, hi); };
  const uint32_t a[4] = {pair(A[group * 16 + 2 * quad], A[group * 16 + 2 * quad + 1]),
                         pair(A[(group + 8) * 16 + 2 * quad], A[(group + 8) * 16 + 2 * quad + 1]),
                         pair(A[group * 16 + 2 * quad + 8], A[group * 16 + 2 * quad + 9]),
                         pair(A[(group + 8) * 16 + 2 * quad + 8], A[(group + 8) * 16 + 2 * quad + 9])};
  const uint32_t b0 = pair(B[(2 * quad) * 8 + group], B[(2 * quad + 1) * 8 + group]);
  const uint32_t b1 = pair(B[(2 * quad + 8) * 8 + group], B[(2 * quad + 9) * 8 + group]);
  float acc[4] = {C[group * 8 + 2 * quad], C[group * 8 + 2 * quad + 1], C[(group + 8) * 8 + 2 * quad],
                  C[(group + 8) * 8 + 2 * quad + 1]};
  tc::mma_bf16(acc, a, b0, b1);
  D[group * 8 + 2 * quad] = acc[0], D[group * 8 + 2 * quad + 1] = acc[1];
  D[(group + 8) * 8 + 2 * quad] = acc[2], D[(group + 8) * 8 + 2 * quad + 1] = acc[3];
}

TEST(CudaEmulation, MmaFragmentLayoutsMatchAPlainMatmul) {
  std::vector<float> A = randoms(16 * 16, 20), B = randoms(16 * 8, 21), C = randoms(16 * 8, 22), D(16 * 8);
  for (float& x : A) x = round_bf16(x);  // exact in bf16: only the sum order may differ
  for (float& x : B) x = round_bf16(x);
  emulate(mma_layout_kernel, {1, 1, 1}, 32, A.data(), B.data(), C.data(), D.data());
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 8; ++c) {
      double want = C[size_t(r * 8 + c)];
      for (int k = 0; k < 16; ++k) want += double(A[size_t(r * 16 + k)]) * B[size_t(k * 8 + c)];
      EXPECT_NEAR(D[size_t(r * 8 + c)], want, 1e-5) << "D[" << r << "][" << c << "]";
    }
}

// Causal GQA attention with the tensor-core kernels' roundings: Q, K, V, P, dO, dS in bf16, sums in
// double. P is normalized by the row's final max here, by the running max in the kernel: the bf16
// roundings of P then differ slightly, hence a tolerance above the fp32 order differences.
struct Bf16Reference {
  std::vector<float> out, lse, dq, dk, dv;
};

Bf16Reference bf16_reference(const Case& c, const std::vector<float>& q, const std::vector<float>& k,
                             const std::vector<float>& v, const std::vector<float>& dout, const std::vector<float>& out,
                             const std::vector<float>& lse, const std::vector<int32_t>& doc, float scale) {
  const int64_t T = c.seq, H = c.heads, KV = c.kv_heads, D = c.head_dim, group = H / KV;
  auto bf = [](const std::vector<float>& x) {
    std::vector<float> r(x.size());
    for (size_t i = 0; i < x.size(); ++i) r[i] = round_bf16(x[i]);
    return r;
  };
  const auto qb = bf(q), kb = bf(k), vb = bf(v), db = bf(dout);
  Bf16Reference ref{std::vector<float>(out.size()), std::vector<float>(lse.size()), std::vector<float>(q.size()),
                    std::vector<float>(k.size()), std::vector<float>(k.size())};
  auto qi = [&](int64_t b, int64_t t, int64_t h) { return size_t(((b * T + t) * H + h) * D); };
  auto ki = [&](int64_t b, int64_t t, int64_t g) { return size_t(((b * T + t) * KV + g) * D); };
  auto dot = [&](const float* x, const float* y) {
    double sum = 0;
    for (int64_t d = 0; d < D; ++d) sum += double(x[d]) * y[d];
    return sum;
  };
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < T; ++t) {
        const int64_t g = h / group, first = c.documents ? doc[size_t(b * T + t)] : 0;
        std::vector<double> s(size_t(t + 1));
        double m = -1e300, l = 0;
        for (int64_t j = first; j <= t; ++j) m = std::fmax(m, s[size_t(j)] = scale * dot(&qb[qi(b, t, h)], &kb[ki(b, j, g)]));
        for (int64_t j = first; j <= t; ++j) l += std::exp(s[size_t(j)] - m);
        ref.lse[size_t((b * H + h) * T + t)] = float(m + std::log(l));
        // The backward from the fp32 out and lse the kernels are given.
        const double lse_t = lse[size_t((b * H + h) * T + t)], d_t = dot(&dout[qi(b, t, h)], &out[qi(b, t, h)]);
        for (int64_t j = first; j <= t; ++j) {
          const double p_fwd = round_bf16(float(std::exp(s[size_t(j)] - m)));
          const double p = std::exp(s[size_t(j)] - lse_t), dp = dot(&db[qi(b, t, h)], &vb[ki(b, j, g)]);
          const double pb = round_bf16(float(p)), ds = round_bf16(float(p * (dp - d_t)));
          for (int64_t d = 0; d < D; ++d) {
            ref.out[qi(b, t, h) + size_t(d)] += float(p_fwd * vb[ki(b, j, g) + size_t(d)] / l);
            ref.dv[ki(b, j, g) + size_t(d)] += float(pb * db[qi(b, t, h) + size_t(d)]);
            ref.dq[qi(b, t, h) + size_t(d)] += float(scale * ds * kb[ki(b, j, g) + size_t(d)]);
            ref.dk[ki(b, j, g) + size_t(d)] += float(scale * ds * qb[qi(b, t, h) + size_t(d)]);
          }
        }
      }
  return ref;
}

using TcKernelFn = void (*)(ak::Args);
struct TcKernels {
  TcKernelFn forward, dq, dkdv;
};
TcKernels tc_kernels_for(int64_t d) {
  if (d == 64) return {tc::forward_kernel<64>, tc::dq_kernel<64>, tc::dkdv_kernel<64>};
  return {tc::forward_kernel<128>, tc::dq_kernel<128>, tc::dkdv_kernel<128>};
}

std::vector<float> minus(std::vector<float> x, const std::vector<float>& y) {
  for (size_t i = 0; i < x.size(); ++i) x[i] -= y[i];
  return x;
}

// The tensor-core kernels, launched as attention.cu does, against the CPU's fp32 kernels (bf16
// tolerance: measured 2e-3 .. 9e-3) and the bf16-rounding reference (measured 1e-7 but for the
// forward's P over several key tiles, 6e-4). The backward adds into non-zero gradients.
void check_tc_case(const Case& c) {
  const std::string name = ::fab::format("bf16 B={} T={} H={} KVH={} D={} docs={}", c.batch, c.seq, c.heads,
                                         c.kv_heads, c.head_dim, c.documents);
  const int64_t rows = c.batch * c.seq, qn = rows * c.heads * c.head_dim, kn = rows * c.kv_heads * c.head_dim;
  const auto q = randoms(qn, 11), k = randoms(kn, 12), v = randoms(kn, 13), dout = randoms(qn, 14);
  std::vector<int32_t> doc(static_cast<size_t>(rows), 0);
  for (int64_t b = 0; c.documents && b < c.batch; ++b)
    for (int64_t t = 0, start = 0, len = 3 + 7 * b; t < c.seq; ++t) {
      if (t - start >= len) start = t, len += 11;
      doc[size_t(b * c.seq + t)] = int32_t(start);
    }
  AttentionShape s{c.batch, c.seq, c.heads, c.kv_heads, c.head_dim, float(1.0 / std::sqrt(double(c.head_dim)))};
  if (c.documents) s.doc_start = doc.data();
  const KernelTable& cpu = *cpu_kernels_for_isa("avx2");
  std::vector<float> out(static_cast<size_t>(qn)), lse(static_cast<size_t>(c.batch * c.heads * c.seq));
  cpu.attention_forward(q.data(), k.data(), v.data(), s, out.data(), lse.data());
  const std::vector<float> dq0 = randoms(qn, 15), dk0 = randoms(kn, 16), dv0 = randoms(kn, 17);
  std::vector<float> dq = dq0, dk = dk0, dv = dv0;
  cpu.attention_backward(q.data(), k.data(), v.data(), out.data(), lse.data(), dout.data(), s, dq.data(), dk.data(),
                         dv.data());
  const Bf16Reference ref = bf16_reference(c, q, k, v, dout, out, lse, doc, s.scale);

  ak::Args a{};
  a.q = q.data(), a.k = k.data(), a.v = v.data(), a.doc = s.doc_start;
  a.tq = c.seq, a.kv_stride = c.seq, a.heads = c.heads, a.kv_heads = c.kv_heads, a.d = c.head_dim, a.scale = s.scale;
  std::vector<float> e_out(out.size()), e_lse(lse.size());
  a.o_write = e_out.data(), a.lse_write = e_lse.data();
  const TcKernels kernels = tc_kernels_for(c.head_dim);
  const unsigned blocks = unsigned((c.seq + 63) / 64);
  emulate(kernels.forward, {blocks, unsigned(c.heads), unsigned(c.batch)}, tc::kThreads, a);
  expect_near_all(e_out, out, 1e-2, name + " out vs fp32");
  expect_near_all(e_lse, lse, 1e-2, name + " lse vs fp32");
  expect_near_all(e_out, ref.out, 2e-3, name + " out vs bf16 reference");  // P's running max, see above
  expect_near_all(e_lse, ref.lse, 1e-5, name + " lse vs bf16 reference");

  std::vector<float> e_dq = dq0, e_dk = dk0, e_dv = dv0, dvec(lse.size());
  a.out = out.data(), a.lse = lse.data(), a.dout = dout.data();
  a.dq = e_dq.data(), a.dk = e_dk.data(), a.dv = e_dv.data(), a.dvec = dvec.data();
  const int64_t stat_rows = rows * c.heads;
  emulate(tc::row_dot_kernel, {unsigned((stat_rows + tc::kWarps - 1) / tc::kWarps), 1, 1}, tc::kThreads, a, stat_rows);
  emulate(kernels.dq, {blocks, unsigned(c.heads), unsigned(c.batch)}, tc::kThreads, a);
  emulate(kernels.dkdv, {blocks, unsigned(c.kv_heads), unsigned(c.batch)}, tc::kThreads, a);
  const char* grads[] = {"dq", "dk", "dv"};
  const std::vector<float>* got[] = {&e_dq, &e_dk, &e_dv};
  const std::vector<float>* fp32[] = {&dq, &dk, &dv};
  const std::vector<float>* start[] = {&dq0, &dk0, &dv0};
  const std::vector<float>* bf16[] = {&ref.dq, &ref.dk, &ref.dv};
  for (int i = 0; i < 3; ++i) {
    const std::vector<float> added = minus(*got[i], *start[i]);
    expect_near_all(added, minus(*fp32[i], *start[i]), 2e-2, name + " " + grads[i] + " vs fp32");
    expect_near_all(added, *bf16[i], 1e-5, name + " " + grads[i] + " vs bf16 reference");
  }
}

TEST(CudaEmulation, TensorCoreAttentionMatchesTheCpu) {
  check_tc_case({1, 70, 2, 1, 64, false});   // two query blocks, T not a multiple of a tile, GQA
  check_tc_case({2, 45, 2, 2, 128, true});   // the widest head (32-key tiles in the backward), documents
  check_tc_case({1, 150, 2, 1, 64, true});   // three blocks whose documents skip key tiles
  check_tc_case({1, 17, 4, 2, 128, false});  // one block, a lone row in the last warp
  check_tc_case({2, 64, 2, 1, 64, true});    // exactly one tile
  check_tc_case({1, 3, 2, 1, 128, false});   // three tokens (one token: dq = dk = 0, no scale to compare)
}

}  // namespace
}  // namespace fab::test
