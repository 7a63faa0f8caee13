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

#include "config/train_config.h"
#include "monitor/tensorboard.h"
#include "parallel/parallel_model.h"
#include "train/checkpoint.h"
#include "monitor/metrics_log.h"
#include "train/optimizer_step.h"
#include "train/sampler.h"
#include "train/stages/stage.h"

namespace fab {

struct StepRecord {
  int64_t step;  // 1-based optimizer step
  double loss, lr, grad_norm, tokens_per_s;
  double step_seconds = 0;  // wall time per step over the steps since the previous log
};

class Trainer {
 public:
  // `model` carries its layout (parallelize(), parallel/parallelize.h); the stage config.stage
  // names runs on it (train/stages/). Every rank runs a Trainer with the same config; the main rank
  // writes metrics, logs and the final model.
  Trainer(TrainConfig config, std::unique_ptr<ParallelModel> model, TrainData data);
  ~Trainer();

  // Trains to the end (or until SIGINT/SIGTERM, after which it saves a checkpoint and returns
  // false). Throws a UserError naming the step if the loss becomes NaN or infinite.
  bool run();

  int64_t total_steps() const { return total_steps_; }
  const std::vector<StepRecord>& history() const { return history_; }
  // What MFU is measured against: "74.9 GFLOP/s fp32 per process (measured now, cached in ...)".
  const std::string& mfu_basis() const { return mfu_basis_; }
  // Mean loss over the evaluation set (no gradients).
  double evaluate();

 private:
  // The stop request (any rank got SIGINT/SIGTERM) and the timed save (due on rank 0's clock),
  // agreed over every rank after each step, so every rank stops or saves after the same step.
  void agree_on_stop_and_save();
  bool timed_save_due() const;
  // trace: records the steps of trace_steps; after the last one, writes output_dir/trace/rank-N.json.
  void trace_before_step(int64_t step);
  void trace_after_step(int64_t step);
  void note_untraced_run() const;  // trace: true whose trace_steps this run never reaches
  void log_step(const StepRecord& record, double eval_loss);
  void show_progress(int64_t step, double loss, double lr, double tokens_per_s, double elapsed);
  void set_mfu_peak();
  double mfu(double tokens_per_s) const;
  void save(int64_t step);
  void resume(const std::string& checkpoint);
  void finish();

  TrainConfig config_;
  std::unique_ptr<ParallelModel> model_;
  TrainData data_;
  bool main_ = true;  // writes metrics, logs, the final model
  TrainerState state_;
  OptimizerStep optimizer_;
  std::unique_ptr<TrainingStage> stage_;
  int64_t steps_since_log_ = 0;
  bool stop_requested_ = false;  // some rank got SIGINT/SIGTERM (agreed after the step)
  bool save_due_ = false;        // save_every_minutes passed on rank 0's clock (agreed likewise)
  std::chrono::steady_clock::time_point last_save_;
  std::unique_ptr<AsyncCheckpointWriter> async_writer_;  // async_save
  std::unique_ptr<Sampler> sampler_;
  int64_t total_steps_ = 0, warmup_steps_ = 0, first_step_ = 0;
  std::vector<StepRecord> history_;
  std::string config_yaml_;
  double peak_flops_per_process_ = 0;  // MFU's denominator, over processes()
  std::string mfu_basis_;
  std::unique_ptr<MetricsLog> metrics_;
  std::unique_ptr<TensorBoardWriter> tensorboard_;
};

// Steps of a run as HF's Trainer counts them: max_steps when > 0, else
// ceil(num_train_epochs * max(1, floor(batches_per_epoch / gradient_accumulation_steps))).
int64_t count_total_steps(const TrainConfig& config, int64_t batches_per_epoch);

// Training FLOPs per token for MFU: 6 N + 6 L T C (T the mean sequence length), N the parameters
// in the matmuls the step runs: the vocabulary head for a language model; for a reward model
// (value_head) its C x 1 value head instead, the vocabulary head never being run. Attention is
// counted causal: q.k and p.v for the keys at or before each query, half of PaLM's 12 L T C
// (which torchtitan also uses), because the attention kernels skip the masked half; counted
// whole, a 16K-token row of a small model read 113% of the measured peak.
double training_flops_per_token(const ModelConfig& model, double mean_tokens, bool value_head);

}  // namespace fab
