// Every CPU kernel, on each instruction set this CPU runs: forward and backward against PyTorch
// (build/reference/ops.safetensors from tests/reference/make_reference.py), and backward against
// central finite differences of L = sum(r * y) for a random r.
#include <omp.h>

#include <functional>
#include <vector>

#include "core/rng.h"
#include "io/safetensors.h"
#include "kernels/cpu/matmul_onednn.h"
#include "kernels/kernel_table.h"
#include "test_util.h"

namespace fab {
namespace {

using Floats = std::vector<float>;

Floats to_vec(const Tensor& t) { return Floats(t.data<float>(), t.data<float>() + t.numel()); }

Floats random_floats(int64_t n, uint64_t seed, double scale = 1.0) {
  Rng rng(seed);
  Floats v(static_cast<size_t>(n));
  for (float& x : v) x = float(rng.normal() * scale);
  return v;
}

void expect_close(const Floats& a, const Tensor& b, double tol, const std::string& what) {
  ASSERT_EQ(int64_t(a.size()), b.numel()) << what;
  const double err = test::scaled_error(a.data(), b.data<float>(), b.numel());
  EXPECT_LE(err, tol) << what << ": error " << err << " relative to the tensor's max";
}

void expect_close(const Floats& a, const Floats& b, double tol, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  const double err = test::scaled_error(a.data(), b.data(), int64_t(a.size()));
  EXPECT_LE(err, tol) << what << ": error " << err << " relative to the tensor's max";
}

// Checks an analytic gradient `grad` of L(x) = sum(r * forward(x)) at 24 coordinates of x.
void check_finite_differences(Floats x, const Floats& grad, const std::function<double(const Floats&)>& loss,
                              const std::string& what, double eps = 1e-2, double tol = 2e-2) {
  double scale = 1e-12;
  for (float g : grad) scale = std::max(scale, double(std::fabs(g)));
  Rng pick(7);
  for (int trial = 0; trial < 24; ++trial) {
    const size_t i = size_t(pick.next_u64() % x.size());
    const float saved = x[i];
    x[i] = saved + float(eps);
    const double up = loss(x);
    x[i] = saved - float(eps);
    const double down = loss(x);
    x[i] = saved;
    const double numeric = (up - down) / (2 * eps);
    EXPECT_NEAR(numeric, grad[i], tol * scale) << what << " at " << i;
  }
}

double dot(const Floats& a, const Floats& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += double(a[i]) * double(b[i]);
  return s;
}

class Ops : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    k_ = cpu_kernels_for_isa(GetParam());
    if (!k_) GTEST_SKIP() << "this CPU cannot run the " << GetParam() << " kernels [needs: " << GetParam() << "]";
    ops_ = std::make_unique<SafetensorsFile>(SafetensorsFile::open(test::reference_dir() + "/ops.safetensors"));
  }
  Floats get(const std::string& name) const { return to_vec(ops_->tensor(name)); }
  Tensor ref(const std::string& name) const { return ops_->tensor(name); }
  const KernelTable* k_ = nullptr;
  std::unique_ptr<SafetensorsFile> ops_;
};

TEST_P(Ops, RmsNorm) {
  Floats x = get("rmsnorm.x"), w = get("rmsnorm.w"), dy = get("rmsnorm.dy");
  const int64_t c = int64_t(w.size()), rows = int64_t(x.size()) / c;
  const float eps = std::stof(ops_->metadata().at("rmsnorm.eps"));
  auto forward = [&](const Floats& in, const Floats& weight) {
    Floats y(in.size()), rstd(static_cast<size_t>(rows));
    k_->rmsnorm_forward(in.data(), weight.data(), rows, c, eps, y.data(), rstd.data());
    return std::make_pair(y, rstd);
  };
  auto [y, rstd] = forward(x, w);
  expect_close(y, ref("rmsnorm.y"), 1e-5, "y");
  Floats dx(x.size(), 0.0f), dw(w.size(), 0.0f);
  k_->rmsnorm_backward(x.data(), w.data(), rstd.data(), dy.data(), rows, c, dx.data(), dw.data());
  expect_close(dx, ref("rmsnorm.dx"), 1e-5, "dx");
  expect_close(dw, ref("rmsnorm.dw"), 1e-5, "dw");
  check_finite_differences(x, dx, [&](const Floats& in) { return dot(forward(in, w).first, dy); }, "rmsnorm dx");
  check_finite_differences(w, dw, [&](const Floats& in) { return dot(forward(x, in).first, dy); }, "rmsnorm dw");
}

TEST_P(Ops, Rope) {
  Tensor xt = ref("rope.x");
  const int64_t b = xt.dim(0), t = xt.dim(1), heads = xt.dim(2), d = xt.dim(3);
  Floats x = to_vec(xt), dy = get("rope.dy");
  // Tables as the model builds them (fp32 angles, as transformers).
  std::vector<float> cos(static_cast<size_t>(t * d / 2)), sin(cos.size());
  const double theta = std::stod(ops_->metadata().at("rope.theta"));
  for (int64_t j = 0; j < d / 2; ++j) {
    const float inv_freq = 1.0f / float(std::pow(theta, double(float(2 * j) / float(d))));
    for (int64_t p = 0; p < t; ++p) {
      cos[size_t(p * d / 2 + j)] = std::cos(float(p) * inv_freq);
      sin[size_t(p * d / 2 + j)] = std::sin(float(p) * inv_freq);
    }
  }
  std::vector<int64_t> pos(static_cast<size_t>(b * t));
  for (int64_t r = 0; r < b * t; ++r) pos[size_t(r)] = r % t;
  auto forward = [&](const Floats& in) {
    Floats y(in.size());
    k_->rope_forward(in.data(), y.data(), pos.data(), cos.data(), sin.data(), b * t, heads, d);
    return y;
  };
  expect_close(forward(x), ref("rope.y"), 1e-5, "y");
  Floats dx(x.size(), 0.0f);
  k_->rope_backward(dy.data(), dx.data(), pos.data(), cos.data(), sin.data(), b * t, heads, d);
  expect_close(dx, ref("rope.dx"), 1e-5, "dx");
  check_finite_differences(x, dx, [&](const Floats& in) { return dot(forward(in), dy); }, "rope dx");
}

TEST_P(Ops, Attention) {
  Tensor qt = ref("attn.q"), kt = ref("attn.k");
  const AttentionShape s{qt.dim(0), qt.dim(1), qt.dim(2), kt.dim(2), qt.dim(3),
                         std::stof(ops_->metadata().at("attn.scale"))};
  Floats q = to_vec(qt), k = to_vec(kt), v = get("attn.v"), dout = get("attn.dout");
  auto forward = [&](const Floats& qq, const Floats& kk, const Floats& vv) {
    Floats out(qq.size()), lse(static_cast<size_t>(s.batch * s.heads * s.seq));
    k_->attention_forward(qq.data(), kk.data(), vv.data(), s, out.data(), lse.data());
    return std::make_pair(out, lse);
  };
  auto [out, lse] = forward(q, k, v);
  expect_close(out, ref("attn.out"), 1e-5, "out");
  Floats dq(q.size(), 0.0f), dk(k.size(), 0.0f), dv(v.size(), 0.0f);
  k_->attention_backward(q.data(), k.data(), v.data(), out.data(), lse.data(), dout.data(), s, dq.data(), dk.data(),
                         dv.data());
  expect_close(dq, ref("attn.dq"), 1e-5, "dq");
  expect_close(dk, ref("attn.dk"), 1e-5, "dk");
  expect_close(dv, ref("attn.dv"), 1e-5, "dv");
  check_finite_differences(q, dq, [&](const Floats& in) { return dot(forward(in, k, v).first, dout); }, "dq");
  check_finite_differences(k, dk, [&](const Floats& in) { return dot(forward(q, in, v).first, dout); }, "dk");
  check_finite_differences(v, dv, [&](const Floats& in) { return dot(forward(q, k, in).first, dout); }, "dv");
}

// Attention forward and backward with a document mask (neat packing): q (B, T, H, D) etc., one
// doc_start per token. Returns out, lse, dq, dk, dv.
struct AttentionResult {
  Floats out, lse, dq, dk, dv;
};
AttentionResult run_attention(const KernelTable& kt, const AttentionShape& s, const Floats& q, const Floats& k,
                              const Floats& v, const Floats& dout) {
  AttentionResult r{Floats(q.size()), Floats(size_t(s.batch * s.heads * s.seq)), Floats(q.size(), 0.0f),
                    Floats(k.size(), 0.0f), Floats(v.size(), 0.0f)};
  kt.attention_forward(q.data(), k.data(), v.data(), s, r.out.data(), r.lse.data());
  kt.attention_backward(q.data(), k.data(), v.data(), r.out.data(), r.lse.data(), dout.data(), s, r.dq.data(),
                        r.dk.data(), r.dv.data());
  return r;
}

// Rows [first, first + n) of every batch row b of a (B, T, width) tensor, as a (1, n, width) one.
Floats rows_of(const Floats& x, int64_t T, int64_t width, int64_t b, int64_t first, int64_t n) {
  const auto begin = x.begin() + (b * T + first) * width;
  return Floats(begin, begin + n * width);
}

// Scores of 1e8 to 1e14 (queries and keys of 1e4 to 1e7 each, as blown-up weights make them): the
// flash forward gives the decode kernel's outputs (one key per query dominates: its value row) and
// finite log-sum-exps, and the backward finite gradients. Its exponent once went through an FMA
// whose unrounded product exceeded the rounded maximum (attention_blocks.h scale_tile): NaN.
TEST_P(Ops, AttentionWithHugeScoresStaysFiniteAndAgreesWithTheDecodeKernel) {
  const int64_t T = 70, H = 4, KV = 2, D = 8;  // two key tiles
  const AttentionShape s{1, T, H, KV, D, float(1.0 / std::sqrt(double(D)))};
  for (double magnitude : {1e4, 1e5, 1e6, 1e7}) {
    Rng rng(11);
    Floats q(size_t(T * H * D)), k(size_t(T * KV * D)), v(size_t(T * KV * D)), dout(q.size());
    for (float& x : q) x = float(rng.normal() * magnitude);
    for (float& x : k) x = float(rng.normal() * magnitude);
    for (float& x : v) x = float(rng.normal());
    for (float& x : dout) x = float(rng.normal());
    const AttentionResult r = run_attention(*k_, s, q, k, v, dout);
    Floats decoded(q.size());
    k_->attention_decode(q.data(), k.data(), v.data(), s, 0, T, decoded.data());
    for (size_t i = 0; i < q.size(); ++i) ASSERT_NEAR(r.out[i], decoded[i], 1e-4) << magnitude << " at " << i;
    for (const Floats* f : {&r.lse, &r.dq, &r.dk, &r.dv})
      for (float x : *f) ASSERT_TRUE(std::isfinite(x)) << magnitude;
  }
}

TEST_P(Ops, AttentionInsideDocumentsMatchesPyTorch) {
  Tensor qt = ref("docattn.q"), kt = ref("docattn.k"), starts = ref("docattn.doc_start");
  AttentionShape s{qt.dim(0), qt.dim(1), qt.dim(2), kt.dim(2), qt.dim(3),
                   std::stof(ops_->metadata().at("docattn.scale"))};
  s.doc_start = starts.data<int32_t>();
  const AttentionResult r = run_attention(*k_, s, to_vec(qt), to_vec(kt), get("docattn.v"), get("docattn.dout"));
  expect_close(r.out, ref("docattn.out"), 1e-5, "out");
  expect_close(r.dq, ref("docattn.dq"), 1e-5, "dq");
  expect_close(r.dk, ref("docattn.dk"), 1e-5, "dk");
  expect_close(r.dv, ref("docattn.dv"), 1e-5, "dv");
}

// The identity packing relies on: attention over packed documents equals attention over each
// document alone, forward and backward. Head dim 8 takes the padded-operand path; documents of
// one token, on a tile boundary and spanning tiles.
TEST_P(Ops, AttentionOverPackedDocumentsEqualsEachDocumentAlone) {
  const int64_t T = 150, H = 4, KV = 2, D = 8;
  const std::vector<std::vector<int64_t>> docs = {{0, 5, 64, 65, 140}, {0, 100}};
  const int64_t B = int64_t(docs.size());
  std::vector<int32_t> doc_start(size_t(B * T));
  for (int64_t b = 0; b < B; ++b)
    for (size_t i = 0; i < docs[size_t(b)].size(); ++i) {
      const int64_t first = docs[size_t(b)][i], end = i + 1 < docs[size_t(b)].size() ? docs[size_t(b)][i + 1] : T;
      for (int64_t t = first; t < end; ++t) doc_start[size_t(b * T + t)] = int32_t(first);
    }
  AttentionShape s{B, T, H, KV, D, 0.35f};
  s.doc_start = doc_start.data();
  const Floats q = random_floats(B * T * H * D, 11), k = random_floats(B * T * KV * D, 12),
               v = random_floats(B * T * KV * D, 13), dout = random_floats(B * T * H * D, 14);
  const AttentionResult packed = run_attention(*k_, s, q, k, v, dout);
  for (int64_t b = 0; b < B; ++b)
    for (size_t i = 0; i < docs[size_t(b)].size(); ++i) {
      const int64_t first = docs[size_t(b)][i];
      const int64_t n = (i + 1 < docs[size_t(b)].size() ? docs[size_t(b)][i + 1] : T) - first;
      const AttentionShape alone{1, n, H, KV, D, s.scale};
      const AttentionResult r = run_attention(*k_, alone, rows_of(q, T, H * D, b, first, n),
                                              rows_of(k, T, KV * D, b, first, n), rows_of(v, T, KV * D, b, first, n),
                                              rows_of(dout, T, H * D, b, first, n));
      const std::string what = "row " + std::to_string(b) + " document at " + std::to_string(first);
      expect_close(rows_of(packed.out, T, H * D, b, first, n), r.out, 2e-6, what + " out");
      expect_close(rows_of(packed.dq, T, H * D, b, first, n), r.dq, 2e-6, what + " dq");
      expect_close(rows_of(packed.dk, T, KV * D, b, first, n), r.dk, 2e-6, what + " dk");
      expect_close(rows_of(packed.dv, T, KV * D, b, first, n), r.dv, 2e-6, what + " dv");
      for (int64_t h = 0; h < H; ++h)
        for (int64_t t = 0; t < n; ++t)
          EXPECT_NEAR(packed.lse[size_t((b * H + h) * T + first + t)], r.lse[size_t(h * n + t)], 2e-5) << what;
    }
}

// One document covering every row takes exactly the plain causal code.
TEST_P(Ops, AttentionWithOneDocumentIsBitwiseCausal) {
  const AttentionShape causal{2, 130, 4, 2, 16, 0.25f};
  std::vector<int32_t> zeros(2 * 130, 0);
  AttentionShape one_doc = causal;
  one_doc.doc_start = zeros.data();
  const Floats q = random_floats(2 * 130 * 64, 21), k = random_floats(2 * 130 * 32, 22),
               v = random_floats(2 * 130 * 32, 23), dout = random_floats(2 * 130 * 64, 24);
  const AttentionResult a = run_attention(*k_, causal, q, k, v, dout), b = run_attention(*k_, one_doc, q, k, v, dout);
  EXPECT_EQ(a.out, b.out);
  EXPECT_EQ(a.lse, b.lse);
  EXPECT_EQ(a.dq, b.dq);
  EXPECT_EQ(a.dk, b.dk);
  EXPECT_EQ(a.dv, b.dv);
}

TEST_P(Ops, SwiGlu) {
  Floats gate = get("swiglu.gate"), up = get("swiglu.up"), dh = get("swiglu.dh");
  const int64_t i = ref("swiglu.gate").dim(1), rows = int64_t(gate.size()) / i;
  auto pack = [&](const Floats& g, const Floats& u) {
    Floats gu(static_cast<size_t>(rows * 2 * i));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < i; ++j) {
        gu[size_t(r * 2 * i + j)] = g[size_t(r * i + j)];
        gu[size_t(r * 2 * i + i + j)] = u[size_t(r * i + j)];
      }
    return gu;
  };
  auto forward = [&](const Floats& gu) {
    Floats h(static_cast<size_t>(rows * i));
    k_->swiglu_forward(gu.data(), rows, i, h.data());
    return h;
  };
  Floats gu = pack(gate, up);
  expect_close(forward(gu), ref("swiglu.h"), 1e-5, "h");
  Floats dgu(gu.size(), 0.0f), fresh(gu.size(), std::nanf(""));
  k_->swiglu_backward(gu.data(), dh.data(), rows, i, dgu.data(), true);
  k_->swiglu_backward(gu.data(), dh.data(), rows, i, fresh.data(), false);  // overwrites, even NaN garbage
  expect_close(dgu, pack(get("swiglu.dgate"), get("swiglu.dup")), 1e-5, "dgate_up");
  expect_close(fresh, dgu, 0.0, "dgate_up written into a fresh buffer");
  check_finite_differences(gu, dgu, [&](const Floats& in) { return dot(forward(in), dh); }, "swiglu");
}

// The loss sum and the sum of squares (the gradient norm) are reduced in a fixed order: the same
// bits on 1, 2 and 3 threads, which data-parallel runs and resumes rely on.
TEST_P(Ops, ReductionsGiveTheSameBitsOnAnyThreadCount) {
  const int64_t rows = 5000, vocab = 64, n = 300001;
  const Floats logits = random_floats(rows * vocab, 21), x = random_floats(n, 22);
  std::vector<int64_t> labels(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) labels[size_t(r)] = r % 5 == 0 ? -100 : (r * 37) % vocab;
  std::vector<double> losses, squares;
  const int threads_before = omp_get_max_threads();
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    Floats z = logits;
    losses.push_back(k_->cross_entropy_chunk(z.data(), labels.data(), rows, vocab, 1.0f, nullptr));
    squares.push_back(k_->sum_squares(x.data(), n));
  }
  omp_set_num_threads(threads_before);
  for (size_t i = 1; i < losses.size(); ++i) {
    EXPECT_EQ(losses[i], losses[0]) << "cross-entropy sum on " << i + 1 << " threads";
    EXPECT_EQ(squares[i], squares[0]) << "sum of squares on " << i + 1 << " threads";
  }
}

TEST_P(Ops, CrossEntropy) {
  Tensor logits_t = ref("ce.logits");
  const int64_t rows = logits_t.dim(0), vocab = logits_t.dim(1);
  Floats logits = to_vec(logits_t);
  Tensor labels = ref("ce.labels");
  int64_t counted = 0;
  for (int64_t r = 0; r < rows; ++r) counted += labels.data<int64_t>()[r] != -100;
  auto loss = [&](const Floats& z) {
    Floats work = z;
    return k_->cross_entropy_chunk(work.data(), labels.data<int64_t>(), rows, vocab, 1.0f / float(counted), nullptr) /
           double(counted);
  };
  EXPECT_NEAR(loss(logits), ref("ce.loss").data<float>()[0], 1e-5 * ref("ce.loss").data<float>()[0]);
  Floats grad = logits;
  k_->cross_entropy_chunk(grad.data(), labels.data<int64_t>(), rows, vocab, 1.0f / float(counted), nullptr);
  expect_close(grad, ref("ce.dlogits"), 1e-5, "dlogits");
  // The bf16 output: the same gradient rounded to bf16 (the logits serve as scratch).
  Floats scratch = logits;
  std::vector<bf16> grad16(logits.size());
  k_->cross_entropy_chunk(scratch.data(), labels.data<int64_t>(), rows, vocab, 1.0f / float(counted), grad16.data());
  for (size_t i = 0; i < grad.size(); ++i) EXPECT_EQ(grad16[i].bits, to_bf16(grad[i]).bits) << i;
  check_finite_differences(logits, grad, loss, "cross-entropy", 1e-2, 2e-2);
}

TEST_P(Ops, EmbeddingBackwardSumsRepeatedIds) {
  const int64_t vocab = 5, c = 37;
  std::vector<int64_t> ids = {3, 1, 3, 3, 0};
  Floats table = random_floats(vocab * c, 1), dout = random_floats(int64_t(ids.size()) * c, 2);
  Floats out(ids.size() * size_t(c));
  k_->embedding_forward(ids.data(), int64_t(ids.size()), table.data(), 0, vocab, c, out.data());
  for (size_t i = 0; i < ids.size(); ++i)
    for (int64_t j = 0; j < c; ++j) ASSERT_EQ(out[i * size_t(c) + size_t(j)], table[size_t(ids[i] * c + j)]);
  Floats dtable(table.size(), 0.0f);
  k_->embedding_backward(ids.data(), int64_t(ids.size()), dout.data(), 0, vocab, c, dtable.data());
  for (int64_t j = 0; j < c; ++j) {
    EXPECT_FLOAT_EQ(dtable[size_t(3 * c + j)], dout[size_t(0 * c + j)] + dout[size_t(2 * c + j)] + dout[size_t(3 * c + j)]);
    EXPECT_FLOAT_EQ(dtable[size_t(2 * c + j)], 0.0f);
  }
}

TEST_P(Ops, MatmulAllTranspositionsAndAccumulate) {
  const int64_t m = 37, n = 29, kk = 45;
  Floats a = random_floats(m * kk, 3), b = random_floats(kk * n, 4);
  Floats expected(size_t(m * n), 0.0f);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t p = 0; p < kk; ++p) s += double(a[size_t(i * kk + p)]) * double(b[size_t(p * n + j)]);
      expected[size_t(i * n + j)] = float(s);
    }
  Floats at(a.size()), bt(b.size());  // stored transposed: A as (K, M), B as (N, K)
  for (int64_t i = 0; i < m; ++i)
    for (int64_t p = 0; p < kk; ++p) at[size_t(p * m + i)] = a[size_t(i * kk + p)];
  for (int64_t p = 0; p < kk; ++p)
    for (int64_t j = 0; j < n; ++j) bt[size_t(j * kk + p)] = b[size_t(p * n + j)];
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      Floats c(size_t(m * n), 1.0f);
      MatmulArgs args;
      args.a = ta ? at.data() : a.data();
      args.b = tb ? bt.data() : b.data();
      args.c = c.data();
      args.m = m, args.n = n, args.k = kk;
      args.trans_a = ta, args.trans_b = tb, args.accumulate = true;
      k_->matmul(args);
      for (float& x : c) x -= 1.0f;
      expect_close(c, expected, 1e-5, "matmul trans_a=" + std::to_string(ta) + " trans_b=" + std::to_string(tb));
    }
}

// bf16 GEMM: inputs in bf16, products accumulated in fp32, output fp32, in all four layouts, on
// both paths where this CPU has both (oneDNN's bf16 matmul, and widening to f32, the only one
// where oneDNN has no bf16 matmul: ONEDNN_MAX_CPU_ISA=AVX2). Large enough that the widening runs
// on every thread.
TEST_P(Ops, Bf16MatmulAccumulatesRoundedInputsInFp32) {
  const int64_t m = 300, n = 70, kk = 256;
  Floats a = random_floats(m * kk, 7), b = random_floats(kk * n, 8);
  std::vector<bf16> a16(a.size()), b16(b.size()), at16(a.size()), bt16(b.size());
  for (size_t i = 0; i < a.size(); ++i) a16[i] = to_bf16(a[i]);
  for (size_t i = 0; i < b.size(); ++i) b16[i] = to_bf16(b[i]);
  Floats expected(size_t(m * n), 0.0f);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t p = 0; p < kk; ++p)
        s += double(to_f32(a16[size_t(i * kk + p)])) * double(to_f32(b16[size_t(p * n + j)]));
      expected[size_t(i * n + j)] = float(s);
    }
  for (int64_t i = 0; i < m; ++i)
    for (int64_t p = 0; p < kk; ++p) at16[size_t(p * m + i)] = a16[size_t(i * kk + p)];
  for (int64_t p = 0; p < kk; ++p)
    for (int64_t j = 0; j < n; ++j) bt16[size_t(j * kk + p)] = b16[size_t(p * n + j)];
  const std::string isa = cpu::onednn_isa();
  std::vector<std::string> paths = {"widened"};
  if (isa == "avx512_core_bf16" || isa == "avx512_core_amx") paths.push_back("native");
  for (const std::string& path : paths)
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb) {
        ::setenv("FAB_BF16_GEMM", path.c_str(), 1);
        Floats c(size_t(m * n), 1.0f);
        MatmulArgs args;
        args.a = ta ? at16.data() : a16.data();
        args.b = tb ? bt16.data() : b16.data();
        args.c = c.data();
        args.m = m, args.n = n, args.k = kk;
        args.trans_a = ta, args.trans_b = tb, args.accumulate = true;
        args.dtype = DType::bf16;
        k_->matmul(args);
        ::unsetenv("FAB_BF16_GEMM");
        for (float& x : c) x -= 1.0f;
        expect_close(c, expected, 1e-5, path + " bf16 matmul trans_a=" + std::to_string(ta) + " trans_b=" + std::to_string(tb));
      }
}

TEST_P(Ops, AdamWMatchesTorchFormula) {
  const int64_t n = 1000;
  Floats p = random_floats(n, 5), g = random_floats(n, 6), m(size_t(n), 0.0f), v(size_t(n), 0.0f);
  Floats p_ref = p;
  std::vector<double> m_ref(size_t(n), 0.0), v_ref(size_t(n), 0.0);
  const AdamWArgs base{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 0};
  for (int64_t step = 1; step <= 3; ++step) {
    AdamWArgs args = base;
    args.step = step;
    k_->adamw_step(p.data(), g.data(), m.data(), v.data(), n, args, nullptr);
    for (int64_t i = 0; i < n; ++i) {  // torch.optim.AdamW in double
      const double gi = g[size_t(i)];
      double param = double(p_ref[size_t(i)]) * (1.0 - 1e-2 * 0.1);
      m_ref[size_t(i)] = 0.9 * m_ref[size_t(i)] + 0.1 * gi;
      v_ref[size_t(i)] = 0.95 * v_ref[size_t(i)] + 0.05 * gi * gi;
      const double denom = std::sqrt(v_ref[size_t(i)]) / std::sqrt(1.0 - std::pow(0.95, double(step))) + 1e-8;
      param -= 1e-2 / (1.0 - std::pow(0.9, double(step))) * m_ref[size_t(i)] / denom;
      p_ref[size_t(i)] = float(param);
    }
  }
  expect_close(p, p_ref, 1e-6, "params after 3 AdamW steps");
  std::vector<bf16> copy(static_cast<size_t>(n));
  AdamWArgs args = base;
  args.step = 4;
  k_->adamw_step(p.data(), g.data(), m.data(), v.data(), n, args, copy.data());
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(copy[size_t(i)].bits, to_bf16(p[size_t(i)]).bits) << "bf16 copy at " << i;
}

TEST_P(Ops, SumSquaresAndScale) {
  Floats x = random_floats(10007, 8);
  double expected = 0;
  for (float f : x) expected += double(f) * double(f);
  EXPECT_NEAR(k_->sum_squares(x.data(), int64_t(x.size())), expected, 1e-5 * expected);
  k_->scale(x.data(), int64_t(x.size()), 0.5f);
  EXPECT_NEAR(k_->sum_squares(x.data(), int64_t(x.size())), expected / 4, 1e-5 * expected);
}

TEST_P(Ops, Bf16ConversionRoundsToNearestEven) {
  Floats x = {1.0f, 1.00390625f, 1.01171875f, -2.5f, 3.0e-20f, 65504.0f, 1.0f + 1.0f / 256 + 1.0f / 512};
  std::vector<bf16> out(x.size());
  k_->to_bf16(x.data(), out.data(), int64_t(x.size()));
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(out[i].bits, to_bf16(x[i]).bits) << x[i];
  EXPECT_EQ(to_f32(out[1]), 1.0f);          // halfway between 1 and 1+2^-7: ties to even
  EXPECT_EQ(to_f32(out[2]), 1.015625f);     // halfway, odd neighbour below: rounds up
}

INSTANTIATE_TEST_SUITE_P(Isa, Ops, ::testing::Values("avx512", "avx2"));

}  // namespace
}  // namespace fab
