// The indexed attention blocks of context parallelism (kernels/cpu/attention_ring.h) on rows long
// enough for many query and key tiles, in one process: each simulated rank holds chunks r and
// 2cp-1-r of every row, attends to every rank's block in turn, and must reproduce the one-process
// flash kernel on its rows -- outputs, log-sum-exps, and dq, dk, dv summed over the blocks, within
// 2e-6 of each tensor's largest value (float sums in another order: the old per-query kernel
// reached 1.1e-6 here too) -- with and without a document mask, head_dim a whole vector
// or not, GQA.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/rng.h"
#include "kernels/cpu/attention_ring.h"
#include "kernels/kernel_table.h"

namespace fab {
namespace {

using Floats = std::vector<float>;

Floats random_floats(size_t n, uint64_t seed) {
  Rng rng(seed);
  Floats x(n);
  for (float& f : x) f = float(double(rng.next_u64() % 20001) / 10000.0 - 1.0);
  return x;
}

// The row indices rank r holds under context parallel: chunks r and 2cp-1-r of 2cp.
std::vector<int32_t> rank_indices(int64_t seq, int cp, int r) {
  const int64_t chunk = seq / (2 * cp);
  std::vector<int32_t> idx;
  for (int c : {r, 2 * cp - 1 - r})
    for (int64_t t = 0; t < chunk; ++t) idx.push_back(int32_t(c * chunk + t));
  return idx;
}

// Rows `idx` of each batch row of x (batch, seq, width).
Floats take(const Floats& x, int64_t batch, int64_t seq, int64_t width, const std::vector<int32_t>& idx) {
  Floats out;
  for (int64_t b = 0; b < batch; ++b)
    for (int32_t i : idx) out.insert(out.end(), x.begin() + (b * seq + i) * width, x.begin() + (b * seq + i + 1) * width);
  return out;
}

struct Case {
  int cp;
  int64_t head_dim;
  bool documents;
};

void expect_ring_matches_one_process(const Case& c) {
  const int64_t B = 2, T = 2 * c.cp * 70, H = 4, G = 2, D = c.head_dim;
  const float scale = float(1.0 / std::sqrt(double(D)));
  const Floats q = random_floats(size_t(B * T * H * D), 1), k = random_floats(size_t(B * T * G * D), 2),
               v = random_floats(size_t(B * T * G * D), 3), dout = random_floats(size_t(B * T * H * D), 4);
  std::vector<int32_t> doc(size_t(B * T), 0);  // documents of 37 tokens in row 0, 101 in row 1
  if (c.documents)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t) doc[size_t(b * T + t)] = int32_t(t / (b ? 101 : 37) * (b ? 101 : 37));

  // One process.
  const KernelTable& kt = cpu_kernels();
  AttentionShape shape{B, T, H, G, D, scale};
  if (c.documents) shape.doc_start = doc.data();
  Floats out1(q.size()), lse1(size_t(B * H * T)), dq1(q.size(), 0), dk1(k.size(), 0), dv1(v.size(), 0);
  kt.attention_forward(q.data(), k.data(), v.data(), shape, out1.data(), lse1.data());
  kt.attention_backward(q.data(), k.data(), v.data(), out1.data(), lse1.data(), dout.data(), shape, dq1.data(),
                        dk1.data(), dv1.data());

  // Every rank's queries against every rank's block; dk, dv of a block go back to its rank.
  std::vector<std::vector<int32_t>> indices;
  std::vector<Floats> k_of, v_of, dk_of, dv_of;
  for (int r = 0; r < c.cp; ++r) {
    indices.push_back(rank_indices(T, c.cp, r));
    k_of.push_back(take(k, B, T, G * D, indices.back()));
    v_of.push_back(take(v, B, T, G * D, indices.back()));
    dk_of.emplace_back(k_of.back().size(), 0.0f);
    dv_of.emplace_back(v_of.back().size(), 0.0f);
  }
  double worst_out = 0, worst_lse = 0, worst_dq = 0;  // largest differences, then relative to the largest value
  for (int r = 0; r < c.cp; ++r) {
    const std::vector<int32_t>& mine = indices[size_t(r)];
    const int64_t n = int64_t(mine.size());
    const Floats qr = take(q, B, T, H * D, mine), dor = take(dout, B, T, H * D, mine);
    std::vector<int32_t> query_doc;
    for (int64_t b = 0; b < B; ++b)
      for (int32_t i : mine) query_doc.push_back(doc[size_t(b * T + i)]);
    Floats out(qr.size(), 0), lse(size_t(B * H * n), -INFINITY), dq(qr.size(), 0);
    const auto block = [&](int src) {
      cpu::IndexedAttention s;
      s.batch = B, s.queries = n, s.keys = int64_t(indices[size_t(src)].size());
      s.heads = H, s.kv_heads = G, s.head_dim = D, s.scale = scale;
      s.query_index = mine.data(), s.query_doc = c.documents ? query_doc.data() : nullptr;
      s.key_index = indices[size_t(src)].data();
      return s;
    };
    // The blocks in ring order (r, r-1, ...); the backward in another order, as any must do.
    for (int step = 0; step < c.cp; ++step) {
      const int src = (r - step + c.cp) % c.cp;
      cpu::attention_block_forward(qr.data(), k_of[size_t(src)].data(), v_of[size_t(src)].data(), block(src),
                                   out.data(), lse.data());
    }
    for (int step = 0; step < c.cp; ++step) {
      const int src = (r + step) % c.cp;
      cpu::attention_block_backward(qr.data(), k_of[size_t(src)].data(), v_of[size_t(src)].data(), out.data(),
                                    lse.data(), dor.data(), block(src), dq.data(), dk_of[size_t(src)].data(),
                                    dv_of[size_t(src)].data());
    }
    const Floats want_out = take(out1, B, T, H * D, mine), want_dq = take(dq1, B, T, H * D, mine);
    for (size_t i = 0; i < out.size(); ++i) {
      worst_out = std::max(worst_out, std::fabs(double(out[i]) - want_out[i]));
      worst_dq = std::max(worst_dq, std::fabs(double(dq[i]) - want_dq[i]));
    }
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < n; ++i)
          worst_lse = std::max(worst_lse, std::fabs(double(lse[size_t((b * H + h) * n + i)]) -
                                                    lse1[size_t((b * H + h) * T + mine[size_t(i)])]));
  }
  double worst_dk = 0, worst_dv = 0;
  for (int r = 0; r < c.cp; ++r) {
    const Floats want_dk = take(dk1, B, T, G * D, indices[size_t(r)]), want_dv = take(dv1, B, T, G * D, indices[size_t(r)]);
    for (size_t i = 0; i < want_dk.size(); ++i) {
      worst_dk = std::max(worst_dk, std::fabs(double(dk_of[size_t(r)][i]) - want_dk[i]));
      worst_dv = std::max(worst_dv, std::fabs(double(dv_of[size_t(r)][i]) - want_dv[i]));
    }
  }
  const auto largest = [](const Floats& x) {
    double m = 0;
    for (float f : x) m = std::max(m, double(std::fabs(f)));
    return m;
  };
  worst_out /= largest(out1), worst_lse /= largest(lse1), worst_dq /= largest(dq1);
  worst_dk /= largest(dk1), worst_dv /= largest(dv1);
  const std::string what = "cp " + std::to_string(c.cp) + ", head_dim " + std::to_string(D) +
                           (c.documents ? ", documents" : ", causal");
  EXPECT_LE(worst_out, 2e-6) << what;
  EXPECT_LE(worst_lse, 2e-6) << what;
  EXPECT_LE(worst_dq, 2e-6) << what;
  EXPECT_LE(worst_dk, 2e-6) << what;
  EXPECT_LE(worst_dv, 2e-6) << what;
}

TEST(RingAttentionBlocks, RanksTogetherReproduceOneProcessOverManyTiles) {
  for (int cp : {2, 3})
    for (int64_t head_dim : {16, 12})
      for (bool documents : {false, true}) expect_ring_matches_one_process({cp, head_dim, documents});
}

}  // namespace
}  // namespace fab
