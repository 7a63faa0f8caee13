#pragma once
// How the decoder's parameters are split and where the split needs communication. Every model
// has one Sharding: SingleDevice (below) when one process holds every parameter, or
// parallel/tensor_parallel.{h,cpp}'s TensorParallel, which answers over the tensor-parallel group
// (this layer knows no communicator). The decoder asks it and never branches on which.
#include <cstdint>

#include "nn/ops.h"

namespace fab {

// One parameter of a sharded model: the Hugging Face tensor's shape, and the slice along
// `split_dim` (0: rows, column-parallel weights, their biases and the vocabulary; 1: columns,
// row-parallel weights) that this rank holds. split_dim -1: every rank holds it whole. A slice may
// run past the HF tensor's end (a vocabulary tp does not divide, padded): those rows are padding,
// zero, never loaded, never saved. `replicas` > 1: groups of that many neighbouring ranks hold the
// same slice (K/V heads when tp exceeds them: each group shares one head).
struct ShardSpec {
  int split_dim = -1;
  Shape full_shape;
  int64_t begin = 0;  // first row / column of this rank's slice
  int64_t length = 0;  // rows / columns of the slice (padding included)
  int replicas = 1;
  // Expert parallel: a fused (E, out, in) experts block split along the experts (split_dim 0) over
  // the expert-parallel group, not the tensor-parallel one.
  bool over_experts = false;
  // The shape of the slice this rank holds.
  Shape local_shape() const {
    Shape local = full_shape;
    if (split_dim >= 0) local[size_t(split_dim)] = length;
    return local;
  }
};

// Expert parallel's split of a mixture-of-experts model's experts (Megatron's expert parallel):
// rank `rank` of `ranks` holds experts [rank E / ranks, (rank + 1) E / ranks) of every MoE layer,
// and only those. ranks 1: every expert.
struct ExpertShare {
  int ranks = 1, rank = 0;
  int64_t count(int64_t experts) const { return experts / ranks; }
  int64_t first(int64_t experts) const { return rank * count(experts); }
  bool holds(int64_t expert, int64_t experts) const {
    return expert >= first(experts) && expert < first(experts) + count(experts);
  }
};

// The decoder calls these where Megatron's split needs communication. Each is a differentiable
// op; for tensor parallel the derivative sits beside it in tensor_parallel.cpp.
class Sharding {
 public:
  virtual ~Sharding() = default;
  virtual int size() const = 0;
  virtual int rank() const = 0;
  virtual bool sequence_parallel() const = 0;
  // Rows of the residual stream this rank holds for `rows` tokens: all of them, or under sp its
  // share of them padded to a multiple of the group (what crosses a pipeline stage boundary).
  int64_t local_rows(int64_t rows) const { return sequence_parallel() ? (rows + size() - 1) / size() : rows; }
  // A column-parallel linear (layer: this rank's output features): x is every row, or under sp
  // this rank's rows (gathered inside); the result is this rank's features of every row.
  virtual Var column_parallel_linear(Tape& tape, const Var& x, const Linear& layer, int64_t rows) = 0;
  // A row-parallel linear (layer: this rank's input features, x: this rank's features of every
  // row): the partial products of every rank summed, all rows (or this rank's rows under sp).
  virtual Var row_parallel_linear(Tape& tape, const Var& x, const Linear& layer, int64_t rows) = 0;
  // A replicated weight applied to this rank's part of the data (the norms under sp, qwen3's
  // q/k norms on this rank's heads): the same value, its gradient summed over the group.
  virtual Var shared_weight(Tape& tape, const Var& weight) = 0;
  // A weight applied to the residual stream's rows (the layer norms): shared_weight under sp,
  // where each rank holds its share of the rows, else the weight itself.
  Var rows_weight(Tape& tape, const Var& weight) { return sequence_parallel() ? shared_weight(tape, weight) : weight; }
  // `layer` whose rows from `first_row` on are replicated over groups of `replicas` neighbouring
  // ranks (the K/V heads a group shares): the same values; those rows' gradients summed over the
  // group. `layer` itself when replicas is 1.
  virtual Linear replicated_rows(Tape& tape, const Linear& layer, int64_t first_row, int replicas) = 0;
  // The vocabulary-parallel embedding: `table` holds rows [vocab_begin, vocab_begin + rows) of
  // the (padded) vocabulary. Returns the residual stream (all rows, or this rank's under sp).
  virtual Var embedding(Tape& tape, const Tensor& ids, const Var& table, int64_t vocab_begin) = 0;
  // The vocabulary-parallel fused head + cross-entropy over `hidden` (as the final norm made it:
  // all rows, or this rank's): the head holds vocabulary rows [vocab_begin, ...), of which those
  // below `vocab` are real. Returns the sum of the token losses, the same on every rank.
  virtual double lm_head_cross_entropy(Tape& tape, const Var& hidden, const Linear& head, const Tensor& labels,
                                       float loss_scale, int64_t vocab_begin, int64_t vocab, int64_t rows) = 0;
};

// One process holds every parameter: the plain ops, no communication. Generation passes run with
// GemmKind::decode (their batch-independent GEMM).
class SingleDevice final : public Sharding {
 public:
  explicit SingleDevice(GemmKind gemm = GemmKind::standard) : gemm_(gemm) {}
  int size() const override { return 1; }
  int rank() const override { return 0; }
  bool sequence_parallel() const override { return false; }
  Var column_parallel_linear(Tape& tape, const Var& x, const Linear& layer, int64_t) override {
    return linear(tape, x, layer, gemm_);
  }
  Var row_parallel_linear(Tape& tape, const Var& x, const Linear& layer, int64_t) override {
    return linear(tape, x, layer, gemm_);
  }
  Var shared_weight(Tape&, const Var& weight) override { return weight; }
  Linear replicated_rows(Tape&, const Linear& layer, int64_t, int) override { return layer; }
  Var embedding(Tape& tape, const Tensor& ids, const Var& table, int64_t) override {
    return fab::embedding(tape, ids, table);
  }
  double lm_head_cross_entropy(Tape& tape, const Var& hidden, const Linear& head, const Tensor& labels,
                               float loss_scale, int64_t, int64_t, int64_t) override {
    return fab::lm_head_cross_entropy(tape, hidden, head, labels, loss_scale);
  }

 private:
  GemmKind gemm_;
};

}  // namespace fab
