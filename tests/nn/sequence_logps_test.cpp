// sequence_logps: per-sequence sums equal a plain log-softmax loop, whatever the chunking (chunks
// that cut through sequences included), and its backward matches central finite differences of
// L = Σ_s g_s · sum_s for the hidden states and the head, in fp32 and bf16. row_scores the same.
// token_logps at a 152K vocabulary: its chunk within its memory budget, values against a plain loop.
#include <gtest/gtest.h>

#include <cmath>

#include "core/backend.h"
#include "core/rng.h"
#include "nn/op_helpers.h"
#include "nn/sequence_logps.h"

namespace fab {
namespace {

constexpr int64_t kSeqs = 3, kT = 5, kC = 6, kV = 11;

Tensor random_tensor(Shape shape, Rng& rng, double scale) {
  Tensor t = Tensor::empty(std::move(shape), DType::f32, MemoryCategory::activations);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = float(rng.normal() * scale);
  return t;
}

Tensor targets_of() {  // -100 on each sequence's first two positions and on one more
  Tensor y = Tensor::empty({kSeqs * kT}, DType::i64, MemoryCategory::activations);
  for (int64_t r = 0; r < kSeqs * kT; ++r) y.data<int64_t>()[r] = r % kT < 2 || r == 8 ? -100 : (r * 7) % kV;
  return y;
}

struct HeadCase {
  Rng rng{7};
  Var hidden = make_var(random_tensor({kSeqs * kT, kC}, rng, 1.0));
  Linear head{make_var(random_tensor({kV, kC}, rng, 0.5)), nullptr, Tensor()};
  Tensor targets = targets_of();
  std::vector<float> g = {0.7f, -1.3f, 0.4f};
};

// Σ_t log softmax(h W^T)[y_t] per sequence, in double.
std::vector<double> plain_logps(const HeadCase& s) {
  std::vector<double> out(kSeqs, 0.0);
  const float* h = s.hidden->value.data<float>();
  const float* w = s.head.weight->value.data<float>();
  for (int64_t r = 0; r < kSeqs * kT; ++r) {
    const int64_t y = s.targets.data<int64_t>()[r];
    if (y == -100) continue;
    std::vector<double> z(kV);
    double mx = -1e30, sum = 0;
    for (int64_t v = 0; v < kV; ++v) {
      for (int64_t c = 0; c < kC; ++c) z[size_t(v)] += double(h[r * kC + c]) * double(w[v * kC + c]);
      mx = std::max(mx, z[size_t(v)]);
    }
    for (double x : z) sum += std::exp(x - mx);
    out[size_t(r / kT)] += z[size_t(y)] - mx - std::log(sum);
  }
  return out;
}

double weighted(const HeadCase& s, const std::vector<double>& sums) {
  double l = 0;
  for (int64_t i = 0; i < kSeqs; ++i) l += double(s.g[size_t(i)]) * sums[size_t(i)];
  return l;
}

TEST(SequenceLogps, SumsMatchAPlainLoopForEveryChunking) {
  HeadCase s;
  const std::vector<double> want = plain_logps(s);
  for (int64_t chunk : {1, 3, 4, 7, 1024}) {
    Tape none(false);
    const SequenceLogps lp = sequence_logps(none, s.hidden, s.head, s.targets, kSeqs, chunk);
    for (int64_t i = 0; i < kSeqs; ++i) {
      EXPECT_NEAR(lp.sum[size_t(i)], want[size_t(i)], 1e-4 * std::fabs(want[size_t(i)])) << "chunk " << chunk;
      EXPECT_EQ(lp.count[size_t(i)], i == 1 ? 2 : 3);
    }
  }
}

TEST(SequenceLogps, BackwardMatchesFiniteDifferences) {
  HeadCase s;
  Tape tape;
  SequenceLogps lp = sequence_logps(tape, s.hidden, s.head, s.targets, kSeqs, 4);  // chunks cut sequences
  *lp.grad = s.g;
  tape.backward();
  const double eps = 1e-3;
  for (Var v : {s.hidden, s.head.weight}) {
    for (int64_t i = 0; i < v->value.numel(); i += 5) {
      float& x = v->value.data<float>()[i];
      const float keep = x;
      x = keep + float(eps);
      const double up = weighted(s, plain_logps(s));
      x = keep - float(eps);
      const double down = weighted(s, plain_logps(s));
      x = keep;
      EXPECT_NEAR(v->grad.data<float>()[i], (up - down) / (2 * eps), 2e-3) << "element " << i;
    }
  }
}

TEST(SequenceLogps, Bf16FollowsFp32) {
  HeadCase s;
  Linear bf16_head = s.head;
  bf16_head.weight_bf16 = Tensor::empty({kV, kC}, DType::bf16, MemoryCategory::parameters);
  backend(DeviceKind::cpu).kernels().to_bf16(s.head.weight->value.data<float>(), bf16_head.weight_bf16.data<bf16>(),
                                             kV * kC);
  Tape none(false);
  const SequenceLogps fp32 = sequence_logps(none, s.hidden, s.head, s.targets, kSeqs);
  const SequenceLogps bf = sequence_logps(none, s.hidden, bf16_head, s.targets, kSeqs);
  for (int64_t i = 0; i < kSeqs; ++i) EXPECT_NEAR(bf.sum[size_t(i)], fp32.sum[size_t(i)], 0.02 * std::fabs(fp32.sum[size_t(i)]));
}

TEST(RowScores, ValuesAndGradients) {
  Rng rng(3);
  Var hidden = make_var(random_tensor({4, kC}, rng, 1.0));
  Linear head{make_var(random_tensor({1, kC}, rng, 0.5)), make_var(random_tensor({1}, rng, 0.5)), Tensor()};
  Tape tape;
  RowScores s = row_scores(tape, hidden, head, {3, 1});
  double want = head.bias->value.data<float>()[0];
  for (int64_t c = 0; c < kC; ++c) want += double(head.weight->value.data<float>()[c]) * hidden->value.data<float>()[3 * kC + c];
  EXPECT_NEAR(s.value[0], want, 1e-6);
  *s.grad = {2.0f, -1.0f};
  tape.backward();
  for (int64_t c = 0; c < kC; ++c) {
    const float w = head.weight->value.data<float>()[c];
    EXPECT_FLOAT_EQ(hidden->grad.data<float>()[3 * kC + c], 2.0f * w);
    EXPECT_FLOAT_EQ(hidden->grad.data<float>()[1 * kC + c], -1.0f * w);
    EXPECT_FLOAT_EQ(hidden->grad.data<float>()[0 * kC + c], 0.0f);
    EXPECT_NEAR(head.weight->grad.data<float>()[c],
                2.0f * hidden->value.data<float>()[3 * kC + c] - hidden->value.data<float>()[1 * kC + c], 1e-6);
  }
  EXPECT_FLOAT_EQ(head.bias->grad.data<float>()[0], 1.0f);
}

}  // namespace
}  // namespace fab

namespace fab {
namespace {

// Issue 31 item 5: at a 152K vocabulary token_logps holds one chunk of logits within 64 MiB (110
// rows, not 1024 rows' 621 MB), forward and backward, and its log-probabilities and entropies
// (rows on all threads, the entropy through the sampling kernel) equal a plain double loop.
TEST(TokenLogps, LargeVocabularyChunksStayWithinTheirBudgetAndMatchAPlainLoop) {
  constexpr int64_t kRows = 300, kWidth = 4, kVocab = 151669;
  EXPECT_EQ(head_chunk_rows(1024, kVocab, kRows), 110);
  EXPECT_EQ(head_chunk_rows(1024, 8192, 5000), 1024);
  EXPECT_EQ(head_chunk_rows(1024, 8192, 40), 40);
  Rng rng(3);
  Var hidden = make_var(random_tensor({kRows, kWidth}, rng, 1.0));
  Linear head{make_var(random_tensor({kVocab, kWidth}, rng, 1.0)), nullptr, Tensor()};
  hidden->requires_grad = head.weight->requires_grad = true;
  Tensor targets = Tensor::empty({kRows}, DType::i64, MemoryCategory::activations);
  for (int64_t r = 0; r < kRows; ++r) targets.data<int64_t>()[r] = r % 7 == 0 ? -100 : (r * 7919) % kVocab;
  Allocator& host = backend(DeviceKind::cpu).allocator();
  host.reset_peaks();
  const size_t before = host.total().live;
  Tape tape;
  TokenLogps lp = token_logps(tape, hidden, head, targets, true, 0.7);
  for (int64_t r = 0; r < kRows; ++r) (*lp.grad)[size_t(r)] = 1.0f;
  tape.backward();
  const size_t gradients = size_t(kVocab + kRows) * kWidth * 4;  // dW and dh
  EXPECT_LT(host.total().peak - before, (size_t(64) << 20) + gradients + (size_t(8) << 20));
  for (int64_t r = 1; r < kRows; r += 37) {
    if (targets.data<int64_t>()[r] == -100) continue;
    std::vector<double> z(kVocab);
    double mx = -1e30, sum = 0, weighted = 0;
    for (int64_t v = 0; v < kVocab; ++v) {
      for (int64_t c = 0; c < kWidth; ++c)
        z[size_t(v)] += double(hidden->value.data<float>()[r * kWidth + c]) * head.weight->value.data<float>()[v * kWidth + c];
      z[size_t(v)] /= 0.7;
      mx = std::max(mx, z[size_t(v)]);
    }
    for (double x : z) sum += std::exp(x - mx), weighted += std::exp(x - mx) * (x - mx);
    EXPECT_NEAR(lp.logp[size_t(r)], z[size_t(targets.data<int64_t>()[r])] - mx - std::log(sum), 1e-4) << r;
    EXPECT_NEAR(lp.entropy[size_t(r)], std::log(sum) - weighted / sum, 1e-4) << r;
  }
}

}  // namespace
}  // namespace fab
