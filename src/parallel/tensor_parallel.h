#pragma once
// Tensor parallelism (Megatron-LM's split) and sequence parallelism over one group of ranks,
// applied to the single-device DecoderModel from outside through Sharding.
//
// The split: q/k/v column-parallel by heads (K/V heads split, or when tp is a multiple of them,
// each shared by a group of tp / num_key_value_heads neighbouring ranks), o_proj
// row-parallel, gate/up column-parallel, down row-parallel, biases with their weights; the
// embedding and the head vocabulary-parallel (a vocabulary tp does not divide is padded at the
// end; the padding is never loaded, saved or given probability). Norm weights are replicated.
//
// The communication is matched pairs of differentiable ops:
//   copy_to_region      forward identity      backward all-reduce
//   reduce_from_region  forward all-reduce    backward identity
// and, with sequence_parallel (the residual stream and the norms on rows/tp rows per rank):
//   gather_rows         forward all-gather    backward reduce-scatter
//   reduce_scatter_rows forward reduce-scatter backward all-gather
// A layer is  x -> norm -> (copy | gather) -> column-parallel linear -> ... -> row-parallel
// linear -> (reduce | reduce-scatter) -> + x. Under sp the gathered input of a column-parallel
// linear is gathered again in backward instead of kept (gathered_linear), and the row-parallel
// partial products are dropped once reduced, so what a layer keeps for backward is 1/tp. Replicated weights that see only this rank's
// rows or heads (norms under sp, q/k norms) get their gradient summed over the group
// (shared_weight). The head never gathers the logits: each rank has its vocabulary slice's
// logits, and the row max, the sum of exponentials and the target's logit are combined over the
// group.
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "io/safetensors.h"
#include "models/decoder.h"
#include "models/sharding.h"

namespace fab {

// Rows of the residual stream under sequence parallel: `rows` padded up to a multiple of the
// group size, `local` = padded / size on every rank; rank r holds rows [r * local, (r+1) * local)
// of the padded stream (padding rows are zeros).
struct RowShard {
  int64_t rows = 0, padded = 0, local = 0;
  static RowShard of(int64_t rows, int ranks);
};

// The ops, over an explicit group.
Var copy_to_region(Tape& tape, const Var& x, Communicator& group);
Var reduce_from_region(Tape& tape, const Var& partial, Communicator& group);
Var gather_rows(Tape& tape, const Var& local, int64_t rows, Communicator& group);
Var reduce_scatter_rows(Tape& tape, const Var& partial, int64_t rows, Communicator& group);
Var sum_gradient_over(Tape& tape, const Var& weight, Communicator& group);
// `layer` with its rows from `first_row` on shared by each group of `replicas` neighbouring ranks:
// the same values, those rows' gradients summed over the group.
Linear replicated_rows(Tape& tape, const Linear& layer, int64_t first_row, int replicas, Communicator& group);
// Sequence parallel's column-parallel linear: gather_rows then linear, but the gathered rows are
// not kept for backward (all-gathered again there), so a layer's saved activations are 1/tp.
Var gathered_linear(Tape& tape, const Var& local, const Linear& layer, int64_t rows, Communicator& group);
// The fused head + cross-entropy over this rank's vocabulary slice, hidden (rows, C) on every rank.
// `group`: the host group (the row maxima and sums are host values).
double vocab_parallel_cross_entropy(Tape& tape, const Var& hidden, const Linear& head, const Tensor& labels,
                                    float loss_scale, int64_t vocab_begin, int64_t vocab, Communicator& group,
                                    int64_t chunk_rows = 1024);

class TensorParallel final : public Sharding {
 public:
  // `device_group`: the same group's collectives over a device's memory (NCCL on CUDA), for the
  // activations and gradients; nullptr: `group` itself. The vocabulary-parallel cross-entropy's
  // row maxima and sums, host values, always take `group`.
  TensorParallel(Communicator& group, bool sequence_parallel, Communicator* device_group = nullptr)
      : group_(group), buffers_(device_group ? *device_group : group), sp_(sequence_parallel) {}
  int size() const override { return group_.size(); }
  int rank() const override { return group_.rank(); }
  bool sequence_parallel() const override { return sp_; }
  Communicator& group() const { return group_; }

  Var column_parallel_linear(Tape& tape, const Var& x, const Linear& layer, int64_t rows) override;
  Var row_parallel_linear(Tape& tape, const Var& x, const Linear& layer, int64_t rows) override;
  Var shared_weight(Tape& tape, const Var& weight) override;
  Linear replicated_rows(Tape& tape, const Linear& layer, int64_t first_row, int replicas) override;
  Var embedding(Tape& tape, const Tensor& ids, const Var& table, int64_t vocab_begin) override;
  double lm_head_cross_entropy(Tape& tape, const Var& hidden, const Linear& head, const Tensor& labels,
                               float loss_scale, int64_t vocab_begin, int64_t vocab, int64_t rows) override;

 private:
  Communicator& group_;
  Communicator& buffers_;
  bool sp_;
};

// Every parameter of a tensor-parallel model whole, as Hugging Face names and shapes it: the
// slices of every rank gathered (padding dropped), and the frozen parameters (whole on every
// rank). Collective over the group; every rank gets them. `grads`: the trainable parameters'
// gradients instead of the weights.
std::vector<NamedTensor> gather_full_tensors(const DecoderModel& model, Communicator& group, bool grads = false);

// Flat-buffer ranges [first, second) of parameters this rank leaves out of the gradient norm: those
// every rank holds whole (counted by tp rank 0) and those a group of ranks shares (counted by the
// group's first rank). The split ones count on every rank.
std::vector<std::pair<int64_t, int64_t>> ranges_counted_elsewhere(const DecoderModel& model);

}  // namespace fab
