#pragma once
// A training stage as the Trainer runs it: pt and sft (language_model_stage.h), dpo, kto and rm
// (preference_stage.h), grpo and ppo (rollout_stage.h, ppo_stage.h). A stage turns the items the
// sampler deals into one optimizer step — micro-batches of a loss, or rollouts and their updates —
// ending every update in the shared OptimizerStep; it evaluates, names its metrics, and keeps what
// it trains besides the model in the checkpoints. The loop, the schedule, checkpoints of the model,
// logging and the final save are the Trainer's; the layout is the ParallelModel's.
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/communicator.h"
#include "config/train_config.h"
#include "dataset/token_sequences.h"
#include "parallel/parallel_model.h"
#include "train/batch.h"
#include "train/checkpoint.h"
#include "train/optimizer_step.h"
#include "train/sampler.h"

namespace fab {

class Tokenizer;

// What the rollout stages need besides the data: the tokenizer that decodes responses and answers,
// the ids that end a response, and the end-of-turn text stripped before comparing.
struct RolloutEnvironment {
  const Tokenizer* tokenizer = nullptr;
  std::vector<int32_t> stop_ids;
  std::string eos_token;
  std::function<int()> stop_signal;  // non-zero once a stop signal arrived (ends a running reward command)
};

struct TrainData {
  TokenSequences train, eval;
  int32_t pad_id = 0;  // fills the end of shorter samples in a batch (their labels are -100)
  std::vector<uint8_t> train_desirable = {}, eval_desirable = {};  // kto: each example's tag
  RolloutEnvironment rollout = {};  // grpo, ppo: the tokenizer and stop ids of rollouts
  // pt, sft of a vision-language model: each sequence's images (empty: text only).
  std::vector<SequenceImages> train_images = {}, eval_images = {};
};

// What every stage is built with. All of it outlives the stage.
struct StageContext {
  const TrainConfig& config;
  ParallelModel& model;
  TrainData& data;
  OptimizerStep& optimizer;
};

struct StepResult {
  double loss = 0;         // the step's (NaN when nan_policy skipped it)
  double grad_norm = NAN;  // of its last update
  int64_t tokens = 0;      // every rank's tokens of the step
};

// Named sums and counts, logged as sum / count over the logging window and every rank.
class StageMetrics {
 public:
  explicit StageMetrics(std::vector<std::string> names) : names_(std::move(names)), values_(2 * names_.size(), 0.0) {}
  void add(size_t metric, double sum, double count = 1) {
    values_[2 * metric] += sum;
    values_[2 * metric + 1] += count;
  }
  const std::vector<std::string>& names() const { return names_; }
  double mean(size_t metric) const { return values_[2 * metric] / values_[2 * metric + 1]; }
  bool has(size_t metric) const { return values_[2 * metric + 1] > 0; }
  // every rank: the sums of all ranks
  void all_reduce(Communicator& group) { group.all_reduce(values_.data(), int64_t(values_.size()), "metrics").wait(); }
  void clear() { std::fill(values_.begin(), values_.end(), 0.0); }

 private:
  std::vector<std::string> names_;
  std::vector<double> values_;  // sum, count per name
};

class TrainingStage {
 public:
  virtual ~TrainingStage() = default;
  // What the sampler deals out: samples (pt, sft), pairs or examples (dpo, rm, kto), prompts.
  virtual int64_t items() const = 0;
  // Before the first step, and before a resume loads its checkpoint: what the stage keeps of the
  // starting weights (a reference). Collective.
  virtual void prepare() {}
  // One optimizer step (0-based `step`) on this rank's next items of `sampler`. Collective.
  virtual StepResult step(int64_t step, double lr, Sampler& sampler) = 0;
  // The mean loss over the evaluation set; NaN without one. Collective.
  virtual double evaluate() { return NAN; }
  // Whether the loss is a mean over tokens (evaluation then reports a perplexity).
  virtual bool token_loss() const { return false; }
  // The stage's metrics since the last call (with the evaluation's when `evaluated`), and the memory
  // it holds besides the model. Collective.
  virtual nlohmann::json metrics(bool /*evaluated*/) { return nlohmann::json::object(); }
  // What the stage trains besides the model (ppo: the critic), into and out of checkpoint `dir`
  // after the Trainer's own part, and into the final output_dir. Collective.
  virtual void save_part(const std::string& /*dir*/, const TrainerState& /*state*/, const std::string& /*yaml*/) {}
  virtual void load_part(const std::string& /*dir*/) {}
  virtual void save_final(const std::string& /*output_dir*/) {}
};

// The stage config.stage names.
std::unique_ptr<TrainingStage> make_training_stage(const StageContext& context);

// The LoRA dropout masks of one forward pass: a stream per (seed, data-parallel rank, pass of the
// run), so a resumed run draws what the uninterrupted one did.
uint64_t dropout_seed(const TrainConfig& config, int rank, int64_t pass);

}  // namespace fab
