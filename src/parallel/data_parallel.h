#pragma once
// Data parallelism and ZeRO over one group of ranks, wrapped around a DecoderModel from outside:
// through its ModelHooks and its flat ParamBuffer.
//
// Buckets are units of parameters (embedding, each layer, head) taken in backward order until they
// hold ddp_bucket_size bytes (one unit each under ZeRO-3). A bucket's gradients leave as soon as
// backward has finished its last unit, and travel while the rest of backward runs. A rank's shard
// is its chunk of every bucket (chunk_range), so every collective is a ring over one contiguous
// range of the flat buffers.
//   stage 0 (DDP): all-reduce each bucket in the last micro-batch; every rank updates everything.
//   stage 1: the same all-reduce, but each rank updates only its shard, holding AdamW state for
//            that shard only; then the parameters are all-gathered.
//   stage 2: every micro-batch reduce-scatters its bucket gradients into a shard accumulator and
//            hands the full-size gradient memory back (Backend::decommit: host pages to the OS,
//            a GPU's granules unmapped).
//   stage 3: a rank also keeps only its shard of the parameters resident; each unit is gathered
//            just before it runs (the next one prefetched) and released after, in forward and
//            again in backward. The flat buffers keep their addresses throughout: released
//            ranges are decommitted and committed again (zeros) before they are written.
// Normalising the loss over the targets of the whole global batch is the trainer's job.
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "core/backend.h"
#include "models/decoder.h"
#include "optim/adamw.h"

namespace fab {

struct DataParallelOptions {
  int zero_stage = 0;
  int64_t bucket_bytes = 25 << 20;  // torch DDP's bucket_cap_mb default
  AdamWConfig adamw;
  // Tensor and pipeline parallel: the model holds slices or a stage, and the gradient norm sums
  // over these groups too (tp, then the stages: together every rank holding a part of one replica).
  // `not_counted`: flat-buffer ranges (ascending, disjoint) this rank leaves out of the norm because
  // another rank of those groups holds the same parameters and counts them.
  std::vector<Communicator*> model_parallel_groups;
  std::vector<std::pair<int64_t, int64_t>> not_counted;
  // The same group's collectives over the model's device memory (NCCL on CUDA), for gradient
  // buckets and parameter gathers; nullptr: `group` itself (host memory). Host values -- the
  // gradient norm's squares -- always go through `group`.
  Communicator* device_group = nullptr;
  // Expert parallel (parallel/expert_parallel.h): flat-buffer ranges (ascending, disjoint) of the
  // experts this rank holds, which the other ranks of its expert-parallel group do not. Their
  // gradients are reduced, and ZeRO shards them, over `expert_data_group` (the data-parallel
  // ranks holding the same experts) instead of the group; without ZeRO the gradient norm adds
  // their squares over `expert_group`. Host groups (expert parallel runs on the CPU).
  std::vector<std::pair<int64_t, int64_t>> expert_ranges;
  Communicator* expert_data_group = nullptr;
  Communicator* expert_group = nullptr;
};

// `ranges` with `extra` added (empty ranges dropped), sorted and merged: DataParallelOptions::not_counted
// of a rank that is both a tensor-parallel rank and a pipeline stage.
std::vector<std::pair<int64_t, int64_t>> merge_ranges(std::vector<std::pair<int64_t, int64_t>> ranges,
                                                      std::pair<int64_t, int64_t> extra);

// What one rank holds of the model states, measured (resident pages of the flat buffers).
struct ModelStateBytes {
  int64_t parameters = 0, gradients = 0, optimizer_state = 0;
};

class DataParallel final : public ModelHooks {
 public:
  DataParallel(DecoderModel& model, Communicator& group, const DataParallelOptions& options);
  ~DataParallel() override;

  // One optimizer step: begin_step, then per micro-batch begin_micro_batch + the model's
  // forward_backward, then finish_gradients, clip_grad_norm, optimizer_step.
  void begin_step(int64_t micro_batches);
  void begin_micro_batch(int64_t index);
  void finish_gradients();
  // The global gradient L2 norm (over the whole group, and the pipeline's stages); clips as
  // torch.nn.utils.clip_grad_norm_.
  double clip_grad_norm(double max_norm);
  void optimizer_step(float lr);

  // ZeRO-3: gathers every unit (before writing the full weights) / releases whatever a
  // forward-only pass or gather_all_parameters left gathered.
  void gather_all_parameters();
  void release_gathered_parameters();
  // Before the weights are overwritten on every rank (a checkpoint loaded): ZeRO-3 makes the
  // released parts writable again (zeros). After: weights_loaded drops what is not this rank's
  // shard again.
  void commit_all_parameters();
  void weights_loaded();

  DecoderModel& model() { return model_; }
  const DecoderModel& model() const { return model_; }
  AdamW& optimizer() { return *optimizer_; }
  const AdamW& optimizer() const { return *optimizer_; }
  int zero_stage() const { return options_.zero_stage; }
  Communicator& group() { return group_; }
  Communicator* device_group() const { return options_.device_group; }
  // What this rank's data-parallel collectives did: the host group's and, where it has one, the
  // device group's (the gradient buckets and parameter gathers), summed.
  CommStats comm_stats() const;
  ModelStateBytes state_bytes() const;
  size_t bucket_count() const { return buckets_.size(); }

  void before_forward(int unit) override;
  void after_forward(int unit) override;
  void before_backward(int unit) override;
  void after_backward(int unit) override;

 private:
  // A contiguous range of a bucket reduced over one group: the data-parallel one, or for the
  // experts this rank holds the expert-data-parallel one.
  struct Piece {
    int64_t begin = 0, end = 0;  // elements of the flat buffers
    int64_t own_begin = 0, own_end = 0;  // this rank's chunk
    int64_t shard_offset = 0;  // where the chunk's gradients sit in shard_grads_
    bool experts = false;
    Communicator* group = nullptr;  // its collectives (host values: the group's own memory)
    CommHandle pending;
  };
  struct Bucket {
    int64_t begin = 0, end = 0;  // elements of the flat buffers
    std::vector<Piece> pieces;   // tiling [begin, end)
    int closing_unit = 0;        // the bucket is final when this unit's backward ends
    bool needs_retire = false;   // stage >= 2: reduce-scattered, not yet added to the shard
  };
  void make_buckets();
  // Every rank of the group must hold the same trainable tensors (so the same buckets and
  // pieces), or the collectives would pair different ranges: a UserError on every rank. Collective.
  void check_same_layout();
  // [begin, end) cut at the expert ranges, each piece chunked over its group from `shard` on.
  std::vector<Piece> make_pieces(int64_t begin, int64_t end, int64_t& shard);
  std::vector<OptimizerSegment> shard_segments(bool grads_in_shard) const;
  void launch_gradient_bucket(Bucket& b);
  void retire(Bucket& b);
  void wait_all_buckets();
  // Squares of the gradients of flat elements [begin, end), read from `g` (the gradient of
  // `begin`), leaving out what another rank of the model-parallel group counts.
  double sum_squares(const float* g, int64_t begin, int64_t end) const;
  const KernelTable& kernels() const;  // the parameters' backend
  Backend& memory() const;
  // Makes flat ranges usable again that ZeRO decommitted: the values (and bf16 copy) of
  // [begin, end); the gradients of one unit.
  void commit_values(int64_t begin, int64_t end);
  void commit_gradients(int unit);
  // ZeRO-3 parameter units.
  void gather(int unit, bool wait);
  void release(int unit);
  const Bucket& unit_bucket(int unit) const { return buckets_[size_t(bucket_of_unit_[size_t(unit)])]; }

  DecoderModel& model_;
  ParamBuffer& params_;
  Communicator& group_;
  Communicator& buffers_;  // options.device_group, else group_
  DataParallelOptions options_;
  std::vector<Bucket> buckets_;
  std::vector<int> bucket_of_unit_;
  Tensor shard_grads_;  // stage >= 2
  std::unique_ptr<AdamW> optimizer_;
  int64_t micro_batches_ = 1, micro_ = 0;
  bool tied_ = false;
  // ZeRO-3: which units are resident in full, and the all-gathers in flight.
  std::vector<char> gathered_;
  std::vector<std::vector<CommHandle>> gathering_;
};

}  // namespace fab
