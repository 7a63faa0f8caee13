// The tensor-parallel ops on every rank of the test world against the one-process ops on the
// whole tensors: outputs, input gradients and each rank's slice of the weight gradients.
#include <gtest/gtest.h>

#include <cstring>

#include "core/rng.h"
#include "mpi/mpi_world.h"
#include "parallel/tensor_parallel.h"
#include "test_util.h"

namespace fab {
namespace {

// The same numbers on every rank.
Tensor random_tensor(Shape shape, uint64_t seed) {
  Tensor t = Tensor::empty(std::move(shape), DType::f32, MemoryCategory::activations);
  Rng rng(seed);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = float(rng.normal());
  return t;
}

Tensor copy_of(const Tensor& t) {
  Tensor out = Tensor::empty(t.shape(), DType::f32, MemoryCategory::activations);
  std::memcpy(out.data<float>(), t.data<float>(), t.bytes());
  return out;
}

// Rows [begin, begin + n) / columns [begin, begin + n) of a (rows, cols) tensor.
Tensor rows_of(const Tensor& t, int64_t begin, int64_t n) {
  const int64_t cols = t.numel() / t.dim(0);
  Tensor out = Tensor::zeros({n, cols}, DType::f32, MemoryCategory::activations);
  const int64_t have = std::max<int64_t>(0, std::min(n, t.dim(0) - begin));
  std::memcpy(out.data<float>(), t.data<float>() + begin * cols, size_t(have * cols) * sizeof(float));
  return out;
}

Tensor cols_of(const Tensor& t, int64_t begin, int64_t n) {
  const int64_t rows = t.dim(0), cols = t.dim(1);
  Tensor out = Tensor::empty({rows, n}, DType::f32, MemoryCategory::activations);
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(out.data<float>() + r * n, t.data<float>() + r * cols + begin, size_t(n) * sizeof(float));
  return out;
}

// sum(y * r): its gradient dy = r.
void backward_with(Tape& tape, const Var& y, const Tensor& r) {
  y->grad = copy_of(r);
  tape.backward();
}

// x (rows, C) -> column-parallel W1 (F, C) -> row-parallel W2 (C, F), as an MLP without its
// activation; with sequence_parallel the input and output are this rank's rows.
void check_column_then_row_parallel(bool sp) {
  Communicator& w = test::world();
  const int ranks = w.size(), rank = w.rank();
  const int64_t rows = 9, c = 6, f = 4 * ranks;  // 9 rows: not a multiple of the group size
  const Tensor x = random_tensor({rows, c}, 1), w1 = random_tensor({f, c}, 2), w2 = random_tensor({c, f}, 3);
  const Tensor r = random_tensor({rows, c}, 4);
  // One process.
  Tape tape;
  Var x1 = make_var(copy_of(x)), a1 = make_var(copy_of(w1)), b1 = make_var(copy_of(w2));
  Var y1 = linear(tape, linear(tape, x1, {a1, nullptr, Tensor()}), {b1, nullptr, Tensor()});
  backward_with(tape, y1, r);
  // This rank.
  const int64_t fl = f / ranks;
  const RowShard s = RowShard::of(rows, ranks);
  Tape tp_tape;
  Var a = make_var(rows_of(w1, rank * fl, fl)), b = make_var(cols_of(w2, rank * fl, fl));
  Var xr = make_var(sp ? rows_of(x, rank * s.local, s.local) : copy_of(x));
  Var in = sp ? gather_rows(tp_tape, xr, rows, w) : copy_to_region(tp_tape, xr, w);
  Var partial = linear(tp_tape, linear(tp_tape, in, {a, nullptr, Tensor()}), {b, nullptr, Tensor()});
  Var y = sp ? reduce_scatter_rows(tp_tape, partial, rows, w) : reduce_from_region(tp_tape, partial, w);
  backward_with(tp_tape, y, sp ? rows_of(r, rank * s.local, s.local) : r);
  const Tensor want_y = sp ? rows_of(y1->value, rank * s.local, s.local) : y1->value;
  const Tensor want_dx = sp ? rows_of(x1->grad, rank * s.local, s.local) : x1->grad;
  test::expect_close(y->value, want_y, 1e-6, "output");
  test::expect_close(xr->grad, want_dx, 1e-6, "input gradient");
  test::expect_close(a->grad, rows_of(a1->grad, rank * fl, fl), 1e-6, "column-parallel weight gradient");
  test::expect_close(b->grad, cols_of(b1->grad, rank * fl, fl), 1e-6, "row-parallel weight gradient");
}

TEST(TensorParallelOps, CopyThenReduceMatchesOneProcess) { check_column_then_row_parallel(false); }
TEST(TensorParallelOps, GatherThenReduceScatterRowsMatchesOneProcess) { check_column_then_row_parallel(true); }

// A vocabulary tp does not divide: ids outside a rank's slice read zero rows; the all-reduce of
// the partial sums is the plain embedding, and each slice gets its rows' gradients.
TEST(TensorParallelOps, VocabParallelEmbeddingMatchesOneProcess) {
  Communicator& w = test::world();
  const int ranks = w.size(), rank = w.rank();
  const int64_t vocab = 4 * ranks + 1, c = 5, n = 12;
  const int64_t slice = (vocab + ranks - 1) / ranks;
  const Tensor table = random_tensor({vocab, c}, 5), r = random_tensor({n, c}, 6);
  Tensor ids = Tensor::empty({n}, DType::i64, MemoryCategory::activations);
  for (int64_t i = 0; i < n; ++i) ids.data<int64_t>()[i] = (i * 5 + 3) % vocab;
  ids.data<int64_t>()[1] = ids.data<int64_t>()[0];  // a repeated id
  Tape tape;
  Var t1 = make_var(copy_of(table));
  Var y1 = embedding(tape, ids, t1);
  backward_with(tape, y1, r);
  for (bool sp : {false, true}) {
    TensorParallel tp(w, sp);
    Tape tp_tape;
    Var t = make_var(rows_of(table, rank * slice, slice));
    Var y = tp.embedding(tp_tape, ids, t, rank * slice);
    const RowShard s = RowShard::of(n, ranks);
    backward_with(tp_tape, y, sp ? rows_of(r, rank * s.local, s.local) : r);
    test::expect_close(y->value, sp ? rows_of(y1->value, rank * s.local, s.local) : y1->value, 0, "embedding");
    test::expect_close(t->grad, rows_of(t1->grad, rank * slice, slice), 1e-6, "embedding gradient");
  }
}

// The fused head + cross-entropy over vocabulary slices (padded, with ignored targets) against
// the one-process op: the loss, the hidden gradient and the head's gradient slices; the padding
// rows of the head get no gradient.
TEST(TensorParallelOps, VocabParallelCrossEntropyMatchesOneProcess) {
  Communicator& w = test::world();
  const int ranks = w.size(), rank = w.rank();
  const int64_t vocab = 6 * ranks - 1, c = 8, rows = 11;
  const int64_t slice = (vocab + ranks - 1) / ranks;
  const Tensor h = random_tensor({rows, c}, 7), head = random_tensor({vocab, c}, 8);
  Tensor labels = Tensor::empty({rows}, DType::i64, MemoryCategory::activations);
  for (int64_t i = 0; i < rows; ++i) labels.data<int64_t>()[i] = i % 4 == 3 ? -100 : (i * 7 + 2) % vocab;
  const float scale = 1.0f / 8;
  Tape tape;
  Var h1 = make_var(copy_of(h)), w1 = make_var(copy_of(head));
  const double loss1 = lm_head_cross_entropy(tape, h1, {w1, nullptr, Tensor()}, labels, scale, 4);
  tape.backward();
  for (bool sp : {false, true}) {
    TensorParallel tp(w, sp);
    const RowShard s = RowShard::of(rows, ranks);
    Tape tp_tape;
    Var hr = make_var(sp ? rows_of(h, rank * s.local, s.local) : copy_of(h));
    Var wr = make_var(rows_of(head, rank * slice, slice));
    const double loss = tp.lm_head_cross_entropy(tp_tape, hr, {wr, nullptr, Tensor()}, labels, scale, rank * slice,
                                                 vocab, rows);
    tp_tape.backward();
    EXPECT_NEAR(loss, loss1, 1e-5 * loss1) << "sp " << sp;
    test::expect_close(hr->grad, sp ? rows_of(h1->grad, rank * s.local, s.local) : h1->grad, 1e-5, "hidden gradient");
    test::expect_close(wr->grad, rows_of(w1->grad, rank * slice, slice), 1e-5, "head gradient");
  }
}

// A replicated weight each rank applies to its own rows: the gradient is the sum over ranks.
TEST(TensorParallelOps, SharedWeightGradientIsSummedOverTheGroup) {
  Communicator& w = test::world();
  const int ranks = w.size(), rank = w.rank();
  const int64_t c = 6, rows = 3 * ranks;
  const Tensor x = random_tensor({rows, c}, 9), weight = random_tensor({c}, 10), r = random_tensor({rows, c}, 11);
  Tape tape;
  Var x1 = make_var(copy_of(x)), w1 = make_var(copy_of(weight));
  backward_with(tape, rmsnorm(tape, x1, w1, 1e-6f), r);
  Tape tp_tape;
  Var xr = make_var(rows_of(x, rank * 3, 3)), wr = make_var(copy_of(weight));
  backward_with(tp_tape, rmsnorm(tp_tape, xr, sum_gradient_over(tp_tape, wr, w), 1e-6f), rows_of(r, rank * 3, 3));
  test::expect_close(wr->grad, w1->grad, 1e-6, "weight gradient");
}

}  // namespace
}  // namespace fab
