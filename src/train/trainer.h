#pragma once
// The step loop of `fabrica train` for the pt and sft stages: micro-batches and gradient
// accumulation with HF's loss normalisation, clipping, AdamW with transformers' schedules,
// evaluation, metrics.jsonl, atomic checkpoints, exact resume, and the final HF folder.
#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "comm/communicator.h"
#include "config/train_config.h"
#include "models/decoder.h"
#include "train/batch.h"
#include "parallel/data_parallel.h"
#include "parallel/mesh.h"
#include "parallel/pipeline_parallel.h"
#include "train/checkpoint.h"
#include "monitor/tensorboard.h"
#include "train/metrics_log.h"
#include "train/grpo_stage.h"
#include "train/ppo_stage.h"
#include "train/stage_objective.h"

namespace fab {

struct TrainData {
  TokenSequences train, eval;
  int32_t pad_id = 0;  // fills the end of shorter samples in a batch (their labels are -100)
  std::vector<uint8_t> train_desirable = {}, eval_desirable = {};  // kto: each example's tag
  GrpoEnvironment grpo = {};  // grpo, ppo: the tokenizer and stop ids of rollouts
};

struct StepRecord {
  int64_t step;  // 1-based optimizer step
  double loss, lr, grad_norm, tokens_per_s;
  double step_seconds = 0;  // wall time per step over the steps since the previous log
};

class Trainer {
 public:
  // `mesh`: this rank's process groups (nullptr: this process alone). `model` was built with
  // model_share()'s options for that mesh; parallelize() wraps it (its stage's pipeline, data
  // parallelism over "dp"). Every rank runs a Trainer with the same config; rank 0 of the
  // data-parallel group (tp rank 0, the first stage) writes metrics, logs and the final model.
  Trainer(TrainConfig config, std::unique_ptr<DecoderModel> model, TrainData data, DeviceMesh* mesh = nullptr);
  ~Trainer();

  // Trains to the end (or until SIGINT/SIGTERM, after which it saves a checkpoint and returns
  // false). Throws a UserError naming the step if the loss becomes NaN or infinite.
  bool run();

  int64_t total_steps() const { return total_steps_; }
  const std::vector<StepRecord>& history() const { return history_; }
  // Mean loss over the evaluation set (no gradients).
  double evaluate();

 private:
  double train_step(int64_t step, double lr, double* grad_norm, int64_t* tokens);
  double pipeline_step(int64_t micro_batches, float scale);
  double grpo_train_step(int64_t step, double lr, double* grad_norm, int64_t* tokens);
  double eval_loss_sum(const Tensor& ids, const Tensor& labels, const SequenceLayout& layout);
  nlohmann::json pipeline_metrics();
  double micro_batch(float loss_scale);
  double evaluate_stage();
  nlohmann::json stage_metrics(double eval_loss);
  // nan_policy: a step whose loss or gradient norm is not finite stops the run (a UserError) or is
  // skipped (returns NaN, the optimizer step not taken).
  double skip_or_stop(int64_t step, const std::string& what);
  bool timed_save_due() const;
  // trace: records the steps of trace_steps; after the last one, writes output_dir/trace/rank-N.json.
  void trace_before_step(int64_t step);
  void trace_after_step(int64_t step);
  void note_untraced_run() const;  // trace: true whose trace_steps this run never reaches
  std::pair<double, double> count_step(int64_t micro_batches) const;  // (targets, tokens) of the next step
  void log_step(const StepRecord& record, double eval_loss);
  void show_progress(int64_t step, double loss, double lr, double tokens_per_s, double elapsed);
  double mfu(double tokens_per_s) const;
  nlohmann::json parallel_metrics();
  void save(int64_t step);
  void resume(const std::string& checkpoint);
  void finish();
  void barrier_all(const std::string& what);  // every rank of the mesh

  TrainConfig config_;
  std::unique_ptr<DecoderModel> model_;
  TrainData data_;
  std::unique_ptr<Communicator> own_world_;  // when training alone: a mesh of one process
  std::unique_ptr<DeviceMesh> own_mesh_;
  Communicator* group_;                       // data parallel
  Communicator* tp_ = nullptr;                // tensor parallel, when the model is split
  bool main_ = true;  // rank 0 of the group (and of the tensor-parallel group, and the first pipeline stage)
  std::unique_ptr<PipelineParallel> pipeline_;  // the model is one pipeline stage
  std::unique_ptr<DataParallel> dp_;
  CommStats comm_at_last_log_, tp_at_last_log_;
  int64_t steps_since_log_ = 0;
  bool stop_requested_ = false;  // some rank got SIGINT/SIGTERM (agreed in the step's all-reduce)
  bool save_due_ = false;        // save_every_minutes passed on rank 0's clock (agreed likewise)
  std::chrono::steady_clock::time_point last_save_;
  std::unique_ptr<AsyncCheckpointWriter> async_writer_;  // async_save
  std::unique_ptr<Sampler> sampler_;
  TrainerState state_;
  int64_t total_steps_ = 0, warmup_steps_ = 0, first_step_ = 0;
  std::vector<StepRecord> history_;
  std::string config_yaml_;
  std::unique_ptr<MetricsLog> metrics_;
  std::unique_ptr<TensorBoardWriter> tensorboard_;
  // dpo, kto, rm (nullptr for pt and sft): the loss of a micro-batch, its metrics since the last
  // log, and those of the last evaluation.
  std::unique_ptr<StageObjective> objective_;
  std::unique_ptr<StageMetrics> train_metrics_, eval_metrics_;
  // stage grpo, or ppo (a PpoStage): rollouts and its updates replace the micro-batches
  std::unique_ptr<GrpoStage> grpo_;
};

// Steps of a run as HF's Trainer counts them: max_steps when > 0, else
// ceil(num_train_epochs * max(1, floor(batches_per_epoch / gradient_accumulation_steps))).
int64_t count_total_steps(const TrainConfig& config, int64_t batches_per_epoch);

// Training FLOPs per token for MFU: 6 N + 12 L T C (T the mean sequence length), N the parameters
// in the matmuls the step runs: the vocabulary head for a language model; for a reward model
// (value_head) its C x 1 value head instead, the vocabulary head never being run.
double training_flops_per_token(const ModelConfig& model, double mean_tokens, bool value_head);

}  // namespace fab
