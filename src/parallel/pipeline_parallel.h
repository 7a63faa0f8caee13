#pragma once
// Pipeline parallelism: the decoder's layers cut into p stages (v model chunks each under the
// interleaved schedule), one DecoderModel per rank holding only its stage's parameters
// (DecoderOptions::stage), and the executor that runs pipeline_schedule()'s actions for one
// optimizer step.
//
// Messages. A forward's output hidden states (B * T, H) go to the next virtual stage and the
// gradient of its input comes back, as non-blocking point-to-point messages (isend/irecv on
// the communication thread). Each receive is posted before the compute action ahead of the one
// that needs it, so the next micro-batch's message arrives while this one computes; sends are
// waited for only at the end of the step. Tags are (kind, receiving virtual stage): between two
// ranks messages of one tag arrive in order, and both sides walk the micro-batches of a virtual
// stage in order.
//
// Tied embeddings (tie_word_embeddings): the first stage holds the embedding, the last stage the
// head with its own copy of the same matrix. Both copies start equal (loaded from the same
// weights) and their gradients are summed between the two stages after each step's backward
// (Megatron's embedding group), so the two AdamW updates are the same bits; the gradient norm
// counts the copy once.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "io/safetensors.h"
#include "models/decoder.h"
#include "parallel/data_parallel.h"
#include "parallel/pipeline_schedule.h"

namespace fab {

// What stage `stage` holds when virtual stage k has layers_per_virtual[k] layers (the
// ParallelLayout's chunk_layers: explicit pipeline_layers or balanced_layer_split): chunk c is
// virtual stage c * p + s.
PipelineStage pipeline_stage(const std::vector<int64_t>& layers_per_virtual, int stages, int stage);

// One micro-batch as every stage sees it: ids (the first stage embeds them; every stage takes
// their shape), labels (the last stage's loss) and the packing layout (every stage's RoPE and
// attention).
struct PipelineMicroBatch {
  Tensor ids, labels;
  SequenceLayout layout;
};

// Measured over the last step (or the steps since reset_stats).
struct PipelineStats {
  double busy_seconds = 0;  // in forward and backward
  double span_seconds = 0;  // from the step's first action to every stage's end
  int64_t bytes_sent = 0;   // activations and gradients this stage sent
  int64_t steps = 0;
};

class PipelineParallel {
 public:
  // `model` holds this rank's stage; `stages` is the pipeline group (rank = stage). Collective
  // over the group (a tied model splits off the first and last stage's embedding group).
  PipelineParallel(DecoderModel& model, Communicator& stages, int virtual_stages);
  ~PipelineParallel();

  int stage() const { return stages_.rank(); }
  int num_stages() const { return stages_.size(); }
  bool is_last() const { return stage() == num_stages() - 1; }
  Communicator& group() { return stages_; }
  const DecoderModel& model() const { return model_; }

  // Forward and backward of every micro-batch in the schedule's order, gradients accumulating
  // in the model's buffers; `dp` is told the micro-batch of each backward, and of each forward
  // through the head (which adds the head's weight gradient at once): its buckets reduce in the
  // last one (ZeRO-0/1) or after each (ZeRO-2). Returns the sum of token losses (the last stage's; 0 elsewhere).
  double forward_backward(const std::vector<PipelineMicroBatch>& batches, float loss_scale, DataParallel& dp);
  // Tied embeddings: the first and last stage's embedding gradients become their sum.
  void sum_tied_gradients();
  // Forward only (evaluation): the loss sum of one batch, on the last stage; 0 elsewhere.
  double loss_sum(const PipelineMicroBatch& batch);
  // Elements of this stage's flat buffers that another stage counts in the gradient norm.
  std::pair<int64_t, int64_t> norm_counted_elsewhere() const;

  // This stage's Hugging Face parameters (trained and frozen), fp32.
  std::vector<NamedTensor> own_weights() const;
  // Every stage's `stage_weights` (its whole HF tensors: own_weights(), or under tensor parallel
  // the slices gathered) collected on stage 0 as the whole model (each name once); empty on the
  // other stages. Collective over the pipeline group.
  std::vector<NamedTensor> gather_weights(const std::vector<NamedTensor>& stage_weights);

  PipelineStats take_stats();

 private:
  int tag(bool gradient, int receiving_virtual_stage) const;
  bool tied_embedding_trains() const;
  Tensor hidden_buffer(const PipelineMicroBatch& b) const;

  DecoderModel& model_;
  Communicator& stages_;
  PipelineShape shape_;
  std::unique_ptr<Communicator> embedding_group_;  // first and last stage, tied models only
  PipelineStats stats_;
};

// The whole model's HF tensors of a pipeline stage whose layers may be tensor-parallel, collected
// for writing: every rank of `tp` gathers its stage's slices (collective over `tp`), then the
// stages' tp rank 0 of data-parallel rank 0 (`collects`) gather them to stage 0. Returned on stage 0
// of those; empty on every other rank.
std::vector<NamedTensor> gather_stage_weights(PipelineParallel& pipeline, Communicator* tp, bool collects);

}  // namespace fab
