#pragma once
// The model as training sees it: the single-device decoder with the strategies parallelize()
// applied — tensor parallel inside it (its Sharding), the pipeline executor and data parallelism
// (ZeRO) around it. Whatever depends on the layout is answered here: how a step's micro-batches
// run, which groups a loss or a flag is summed over, barriers, gathering the whole weights for a
// save, and the per-rank memory and communication report. The trainer, the stages and the
// checkpoints never ask which strategies run.
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/communicator.h"
#include "config/train_config.h"
#include "io/safetensors.h"
#include "models/decoder.h"
#include "parallel/context_parallel.h"
#include "parallel/data_parallel.h"
#include "parallel/mesh.h"
#include "parallel/pipeline_parallel.h"

namespace fab {

// One micro-batch: (B, T) ids and labels and, for packed rows, their layout.
using MicroBatch = PipelineMicroBatch;

class ParallelModel {
 public:
  // Data parallelism alone over `group` (stage ppo's critic).
  ParallelModel(std::unique_ptr<DecoderModel> model, Communicator& group, const DataParallelOptions& options);
  // What parallelize() (parallel/parallelize.h) builds over `mesh` (nullptr: this process alone).
  ParallelModel(std::unique_ptr<DecoderModel> model, DeviceMesh* mesh, const TrainConfig& config);
  ~ParallelModel();

  DecoderModel& model() { return *model_; }
  const DecoderModel& model() const { return *model_; }
  DataParallel& data_parallel() { return *dp_; }
  // The data-parallel replicas, which draw different rows (dp ranks; under context parallel the cp
  // ranks of a replica share its rows, and its gradients are summed over dp x cp: data_parallel()).
  Communicator& data_group() { return data_ ? *data_ : dp_->group(); }
  // Context parallel's sharding of whole rows over the cp ranks (null without context parallel).
  const ContextParallel* context_parallel() const { return cp_.get(); }
  // Rank 0 of every group: writes the logs, metrics and the final model.
  bool is_main() const;
  int processes() const;  // every rank: data x context x tensor x pipeline
  // Where this rank's checkpoint shards sit: (tensor-parallel rank, size), (stage, stages).
  std::pair<int, int> tensor_place() const;
  std::pair<int, int> stage_place() const;
  // (expert-parallel rank, size): this rank holds experts [rank E/size, (rank+1) E/size).
  std::pair<int, int> expert_place() const;

  // The micro-batches of one optimizer step, forward and backward: next(m) gives micro-batch m when
  // it runs (a pipeline takes them all first, then runs its schedule). Accumulates the gradient of
  // scale * (the token losses); returns this rank's loss sum (a pipeline's last stage's; 0 on the
  // others: sum_over_stages shares it; under context parallel, the whole rows', summed over cp).
  double forward_backward(int64_t micro_batches, float scale, const std::function<MicroBatch(int64_t)>& next);
  // Gradient accumulation for an objective that runs the model itself (the preference stages; no
  // pipeline): body(m) runs micro-batch m's forward and backward and returns its loss sum.
  double accumulate(int64_t micro_batches, const std::function<double(int64_t)>& body);
  // The loss sum of an evaluation batch, without gradients (a pipeline's last stage's; 0 elsewhere;
  // the whole rows' under context parallel).
  double loss_sum(const MicroBatch& batch);
  // After the step's backward: the data-parallel reduction, and a pipeline's tied embedding.
  void finish_gradients();

  // Sums over the data-parallel group, and over the pipeline's stages (what only the last stage
  // computes, every stage learns). Collective.
  void sum_over_data(double* values, int64_t n, const std::string& what);
  void sum_over_stages(double* values, int64_t n, const std::string& what);
  // Flags (0 or 1) set on any rank of the job are set on every rank afterwards (the values may
  // exceed 1). Collective.
  void any_rank(double* flags, int64_t n, const std::string& what);
  void barrier(const std::string& what);  // every rank

  // The whole model's Hugging Face tensors on the main rank (`main`): the pipeline's stages and the
  // tensor-parallel slices gathered, else views of the parameters (none under LoRA), which the
  // caller keeps gathered while it uses them. Collective.
  std::vector<NamedTensor> whole_weights(bool main);
  // The trained model into `dir` as an HF folder (LoRA: the adapter folder), written by the main
  // rank. Collective.
  void save_trained_model(const std::string& dir, const std::string& base_model);

  // Since the last call: the model-state bytes of every rank, the largest rank's peak memory (resident
  // or device), the bytes this rank sent per step (data parallel, tensor parallel, context
  // parallel, expert parallel's token exchange), the fraction of data-parallel communication hidden
  // behind computation, and a pipeline's idle fraction and bytes per stage. Collective.
  nlohmann::json report(int64_t steps);

 private:
  nlohmann::json pipeline_report();
  // Context parallel: this rank's share of a whole micro-batch; the loss sum over the cp group.
  MicroBatch context_share(const MicroBatch& whole) const;
  double sum_over_context(double loss_sum);

  std::unique_ptr<Communicator> own_world_;  // a mesh of one process, when training alone
  std::unique_ptr<DeviceMesh> own_mesh_;
  std::unique_ptr<DecoderModel> model_;
  Communicator* tp_ = nullptr;  // the tensor-parallel group, when the model is sliced
  Communicator* data_ = nullptr;  // the dp group under context parallel (dp_ is over cp-dp)
  std::unique_ptr<ContextParallel> cp_;
  std::unique_ptr<PipelineParallel> pipeline_;
  std::unique_ptr<DataParallel> dp_;
  std::unique_ptr<Communicator> ep_;  // the expert-parallel group, expert_parallel_size > 1
  std::unique_ptr<Communicator> expert_data_;  // the data-parallel ranks holding this rank's experts
  std::shared_ptr<ExpertExchange> experts_;
  CommStats comm_at_last_report_, tp_at_last_report_, cp_at_last_report_;
  int64_t ep_at_last_report_ = 0;
};

}  // namespace fab
