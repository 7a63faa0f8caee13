#include "nn/sequence_logps.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/backend.h"
#include "core/error.h"
#include "core/profiler.h"
#include "nn/op_helpers.h"

namespace fab {
namespace {

// Calls fn(sequence, first row, rows) for each piece of the chunk [r0, r0 + n) that lies in one
// sequence of `seq` rows, so per-sequence sums come out of the row-chunked kernels.
template <typename Fn>
void for_each_sequence_piece(int64_t r0, int64_t n, int64_t seq, Fn&& fn) {
  for (int64_t r = r0; r < r0 + n;) {
    const int64_t s = r / seq, end = std::min(r0 + n, (s + 1) * seq);
    fn(s, r, end - r);
    r = end;
  }
}

struct Piece {
  int64_t first = 0, count = 0;
  float g = 0;
};

// The backward shared by sequence_logps and token_logps, for a loss L = sum over pieces of rows
// of g_piece * sum log p(y_r): per chunk of rows the logits z = h W^T again, then for each piece
// dL/dz = -g (softmax(z) - onehot(y)) (cross_entropy_chunk's gradient with scale -g), and
// dh += dz W, dW += dz^T h. `pieces(r0, n, piece)` calls piece(first row, rows, g) over the chunk;
// the pieces of a chunk (disjoint rows) then run on all threads when there are enough of them (one
// row each for token_logps), else one after the other with the kernel's own threads over rows.
// With an inverse temperature s != 1 the log-probabilities are of softmax(s z): the kernel takes
// the scaled logits, and dL/dz = s dL/d(s z) = -g s (softmax(s z) - onehot(y)), its scale -g s.
template <typename Pieces>
void logp_head_backward(const Var& hidden, const Linear& head, const Tensor& h, const Tensor& w_compute,
                        const int64_t* y, int64_t chunk_rows, float inverse_temperature, Pieces&& pieces) {
  const Tensor& w = head.weight->value;
  const int64_t rows = rows_of(hidden->value), c = w.dim(1), vocab = w.dim(0);
  const KernelTable& k = kernels_for(w);
  const bool bf16 = head.weight_bf16.defined();
  Tensor logits = Tensor::empty({chunk_rows, vocab}, DType::f32, MemoryCategory::temporaries, w.device());
  Tensor dz_bf16 =
      bf16 ? Tensor::empty({chunk_rows, vocab}, DType::bf16, MemoryCategory::temporaries, w.device()) : Tensor();
  float* dh = grad_of(hidden).data<float>();
  for (int64_t r0 = 0; r0 < rows; r0 += chunk_rows) {
    const int64_t n = std::min(chunk_rows, rows - r0);
    const Tensor h_chunk = h.view(r0 * c, {n, c});
    gemm(k, h_chunk, false, w_compute, true, logits.data<float>(), n, vocab, c, false);
    if (inverse_temperature != 1.0f) k.scale(logits.data<float>(), n * vocab, inverse_temperature);
    std::vector<Piece> chunk_pieces;
    pieces(r0, n, [&](int64_t first, int64_t count, float g) { chunk_pieces.push_back({first, count, g}); });
    const bool by_piece = w.device().is_host() && int64_t(chunk_pieces.size()) >= omp_get_max_threads();
#pragma omp parallel for schedule(dynamic, 4) if (by_piece)
    for (size_t i = 0; i < chunk_pieces.size(); ++i) {
      const Piece& p = chunk_pieces[i];
      const int64_t at = (p.first - r0) * vocab;
      k.cross_entropy_chunk(logits.data<float>() + at, y + p.first, p.count, vocab, -p.g * inverse_temperature,
                            bf16 ? dz_bf16.data<fab::bf16>() + at : nullptr);
    }
    const Tensor dz = bf16 ? dz_bf16.view(0, {n, vocab}) : logits.view(0, {n, vocab});
    gemm(k, dz, false, w_compute, false, dh + r0 * c, n, c, vocab, true);
    if (head.weight->requires_grad)  // a frozen head (LoRA's base) gets no gradient
      gemm(k, dz, true, h_chunk, false, grad_of(head.weight).data<float>(), vocab, c, n, true);
  }
}

}  // namespace

// Forward: log p(y) = -(lse(z) - z_y), so each piece's sum is minus cross_entropy_chunk's loss.
// Backward, with g_s = dL/d sum_s for the row's sequence s:
//   dL/dz = g_s * d(log p(y))/dz = -g_s (softmax(z) - onehot(y)),
// which is cross_entropy_chunk's gradient with scale -g_s; then dh = dz W and dW += dz^T h.
SequenceLogps sequence_logps(Tape& tape, const Var& hidden, const Linear& head, const Tensor& targets,
                             int64_t sequences, int64_t chunk_rows) {
  ProfileScope profile("sequence_logps");
  const Tensor& w = head.weight->value;
  const int64_t rows = rows_of(hidden->value), c = w.dim(1), vocab = w.dim(0);
  FAB_CHECK(sequences > 0 && rows % sequences == 0 && targets.numel() == rows, "{} rows for {} sequences", rows,
            sequences);
  const int64_t seq = rows / sequences;
  const KernelTable& k = kernels_for(w);
  const bool bf16 = head.weight_bf16.defined();
  const Tensor& w_compute = bf16 ? head.weight_bf16 : w;
  chunk_rows = head_chunk_rows(chunk_rows, vocab, rows);
  auto hidden_compute = [hidden, bf16, rows, c] {
    return bf16 ? to_bf16(hidden->value.reshape({rows, c}), MemoryCategory::temporaries)
                : hidden->value.reshape({rows, c});
  };
  SequenceLogps out;
  out.sum.assign(size_t(sequences), 0.0);
  out.count.assign(size_t(sequences), 0);
  out.grad = std::make_shared<std::vector<float>>(size_t(sequences), 0.0f);
  FAB_CHECK(targets.device().is_host(), "sequence_logps takes its targets on the host");
  for (int64_t r = 0; r < rows; ++r) out.count[size_t(r / seq)] += targets.data<int64_t>()[r] != -100;
  // The kernels read the targets where the head lives (a copy on a device; on the host, themselves).
  const Tensor targets_there = targets.to(w.device(), MemoryCategory::temporaries);
  const int64_t* y = targets_there.data<int64_t>();
  {
    const Tensor h = hidden_compute();
    Tensor logits = Tensor::empty({chunk_rows, vocab}, DType::f32, MemoryCategory::temporaries, w.device());
    for (int64_t r0 = 0; r0 < rows; r0 += chunk_rows) {
      const int64_t n = std::min(chunk_rows, rows - r0);
      gemm(k, h.view(r0 * c, {n, c}), false, w_compute, true, logits.data<float>(), n, vocab, c, false);
      for_each_sequence_piece(r0, n, seq, [&](int64_t s, int64_t first, int64_t count) {
        out.sum[size_t(s)] -=
            k.cross_entropy_chunk(logits.data<float>() + (first - r0) * vocab, y + first, count, vocab, 0.0f, nullptr);
      });
    }
  }
  if (!tape.recording()) return out;
  tape.push([hidden, head, targets_there, seq, chunk_rows, grad = out.grad, hidden_compute, w_compute] {
    ProfileScope profile("sequence_logps backward");
    logp_head_backward(hidden, head, hidden_compute(), w_compute, targets_there.data<int64_t>(), chunk_rows, 1.0f,
                       [&](int64_t r0, int64_t n, auto&& piece) {
                         for_each_sequence_piece(r0, n, seq, [&](int64_t s, int64_t first, int64_t count) {
                           piece(first, count, (*grad)[size_t(s)]);
                         });
                       });
  });
  return out;
}

namespace {

// H = -Σ p log p of the softmax of z, as lse(z) - Σ p z (shifted by the max for range): the
// exponentials by the sampling kernel (vectorised, into `scratch`, vocab floats), the sums in double.
double row_entropy(const KernelTable& k, const float* z, int64_t vocab, float* scratch) {
  const double sum = k.sampling_weights(z, vocab, 1.0f, scratch);
  const float mx = *std::max_element(z, z + vocab);
  double weighted = 0;
#pragma omp simd reduction(+ : weighted)
  for (int64_t j = 0; j < vocab; ++j) weighted += double(scratch[j]) * double(z[j] - mx);
  return std::log(sum) - weighted / sum;
}

}  // namespace

// Forward, with s = 1 / temperature: log p(y_r) = -(lse(s z_r) - s z_r[y_r]), cross_entropy_chunk's
// loss of the one row of scaled logits, negated. Backward, with g_r = dL/d logp_r:
// dL/dz_r = -g_r s (softmax(s z_r) - onehot(y_r)), the kernel's gradient with scale -g_r s, row by
// row; then dh = dz W and dW += dz^T h as in sequence_logps.
double row_token_logp(const float* logits, int64_t vocab, int32_t token, double temperature) {
  const KernelTable& k = backend(DeviceKind::cpu).kernels();
  const float inverse_temperature = float(1.0 / temperature);
  std::vector<float> row(logits, logits + vocab);  // the kernel overwrites its logits
  if (inverse_temperature != 1.0f) k.scale(row.data(), vocab, inverse_temperature);
  const int64_t target = token;
  return -k.cross_entropy_chunk(row.data(), &target, 1, vocab, 0.0f, nullptr);
}

TokenLogps token_logps(Tape& tape, const Var& hidden, const Linear& head, const Tensor& targets, bool with_entropy,
                       double temperature, int64_t chunk_rows, GemmKind kind) {
  ProfileScope profile("token_logps");
  const Tensor& w = head.weight->value;
  const int64_t rows = rows_of(hidden->value), c = w.dim(1), vocab = w.dim(0);
  FAB_CHECK(targets.numel() == rows, "{} targets for {} rows", targets.numel(), rows);
  FAB_CHECK(temperature > 0 && std::isfinite(temperature), "token_logps at temperature {}", temperature);
  const float inverse_temperature = float(1.0 / temperature);
  const KernelTable& k = kernels_for(w);
  const bool bf16 = head.weight_bf16.defined();
  const Tensor& w_compute = bf16 ? head.weight_bf16 : w;
  chunk_rows = head_chunk_rows(chunk_rows, vocab, rows);
  auto hidden_compute = [hidden, bf16, rows, c] {
    return bf16 ? to_bf16(hidden->value.reshape({rows, c}), MemoryCategory::temporaries)
                : hidden->value.reshape({rows, c});
  };
  TokenLogps out;
  out.logp.assign(size_t(rows), 0.0);
  if (with_entropy) out.entropy.assign(size_t(rows), 0.0);
  out.grad = std::make_shared<std::vector<float>>(size_t(rows), 0.0f);
  FAB_CHECK(targets.device().is_host(), "token_logps takes its targets on the host");
  const int64_t* y = targets.data<int64_t>();
  const Tensor targets_there = targets.to(w.device(), MemoryCategory::temporaries);  // what the kernels read
  {
    const Tensor h = hidden_compute();
    Tensor logits = Tensor::empty({chunk_rows, vocab}, DType::f32, MemoryCategory::temporaries, w.device());
    for (int64_t r0 = 0; r0 < rows; r0 += chunk_rows) {
      const int64_t n = std::min(chunk_rows, rows - r0);
      gemm(k, h.view(r0 * c, {n, c}), false, w_compute, true, logits.data<float>(), n, vocab, c, false, kind);
      if (inverse_temperature != 1.0f) k.scale(logits.data<float>(), n * vocab, inverse_temperature);
      // The entropy is taken on the host, from the logits before the kernel overwrites them (a
      // copy of the chunk where they live on a device). On the host, rows run on all threads.
      const bool on_host = w.device().is_host();
      const Tensor host_logits = with_entropy && !on_host ? logits.to(Device::cpu(), MemoryCategory::temporaries) : logits;
      const KernelTable& host = backend(DeviceKind::cpu).kernels();
#pragma omp parallel if (on_host)
      {
        std::vector<float> scratch(with_entropy ? size_t(vocab) : 0);
#pragma omp for schedule(dynamic, 4)
        for (int64_t r = r0; r < r0 + n; ++r) {
          if (y[r] == -100) continue;
          if (with_entropy)
            out.entropy[size_t(r)] = row_entropy(host, host_logits.data<float>() + (r - r0) * vocab, vocab, scratch.data());
          out.logp[size_t(r)] = -k.cross_entropy_chunk(logits.data<float>() + (r - r0) * vocab,
                                                       targets_there.data<int64_t>() + r, 1, vocab, 0.0f, nullptr);
        }
      }
    }
  }
  if (!tape.recording()) return out;
  tape.push([hidden, head, targets_there, chunk_rows, inverse_temperature, grad = out.grad, hidden_compute, w_compute] {
    ProfileScope profile("token_logps backward");
    logp_head_backward(hidden, head, hidden_compute(), w_compute, targets_there.data<int64_t>(), chunk_rows,
                       inverse_temperature, [&](int64_t r0, int64_t n, auto&& piece) {
                         for (int64_t r = r0; r < r0 + n; ++r) piece(r, 1, (*grad)[size_t(r)]);
                       });
  });
  return out;
}

namespace {

// n floats of `t` from element `offset`, on the host / written back: row_scores' few rows of C
// floats go through copies, so it runs the same on any device.
std::vector<float> read_floats(const Tensor& t, int64_t offset, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  backend(DeviceKind::cpu).copy(out.data(), Device::cpu(), t.data<float>() + offset, t.device(), size_t(n) * 4);
  return out;
}
void write_floats(const Tensor& t, int64_t offset, const std::vector<float>& v) {
  backend(DeviceKind::cpu).copy(const_cast<float*>(t.data<float>()) + offset, t.device(), v.data(), Device::cpu(),
                                v.size() * 4);
}

}  // namespace

// s_i = w · h[row_i] + b. Backward: dh[row_i] += g_i w, dw += g_i h[row_i], db += g_i. A handful
// of dot products of length C: host loops over copies of the rows.
RowScores row_scores(Tape& tape, const Var& hidden, const Linear& head, const std::vector<int64_t>& rows) {
  const int64_t c = head.weight->value.dim(1);
  FAB_CHECK(head.weight->value.dim(0) == 1 && hidden->value.dim(-1) == c, "row_scores: a (1, {}) head", c);
  const std::vector<float> w = read_floats(head.weight->value, 0, c);
  const double bias = head.bias ? double(read_floats(head.bias->value, 0, 1)[0]) : 0.0;
  RowScores out;
  out.grad = std::make_shared<std::vector<float>>(rows.size(), 0.0f);
  for (int64_t row : rows) {
    FAB_CHECK(row >= 0 && row < rows_of(hidden->value), "row {} of {}", row, rows_of(hidden->value));
    const std::vector<float> h = read_floats(hidden->value, row * c, c);
    double s = bias;
    for (int64_t j = 0; j < c; ++j) s += double(w[size_t(j)]) * double(h[size_t(j)]);
    out.value.push_back(s);
  }
  if (!tape.recording()) return out;
  tape.push([hidden, head, rows, grad = out.grad, c, w] {
    const bool weight_grad = head.weight->requires_grad, bias_grad = head.bias && head.bias->requires_grad;
    std::vector<float> dw = weight_grad ? read_floats(grad_of(head.weight), 0, c) : std::vector<float>();
    std::vector<float> db = bias_grad ? read_floats(grad_of(head.bias), 0, 1) : std::vector<float>();
    for (size_t i = 0; i < rows.size(); ++i) {
      const float g = (*grad)[i];
      std::vector<float> dh = read_floats(grad_of(hidden), rows[i] * c, c);
      const std::vector<float> h = weight_grad ? read_floats(hidden->value, rows[i] * c, c) : std::vector<float>();
      for (int64_t j = 0; j < c; ++j) {
        dh[size_t(j)] += g * w[size_t(j)];
        if (weight_grad) dw[size_t(j)] += g * h[size_t(j)];
      }
      write_floats(grad_of(hidden), rows[i] * c, dh);
      if (bias_grad) db[0] += g;
    }
    if (weight_grad) write_floats(grad_of(head.weight), 0, dw);
    if (bias_grad) write_floats(grad_of(head.bias), 0, db);
  });
  return out;
}

}  // namespace fab
