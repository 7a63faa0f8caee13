#pragma once
// stage: grpo. One trainer step: this rank's per_device_train_batch_size prompts, each sampled
// num_generations times by rollout() on the current weights (seeds from seed, step, prompt and
// sample, so runs reproduce and resume); rewards; group-normalised advantages (each prompt's group
// lives on one rank); the rollout policy's per-token log-probabilities ("old", a forward without
// gradient) and, with kl_loss_coef, the reference's (the starting weights, or the adapters off
// under LoRA); then ppo_epochs passes over mini-batches of ppo_mini_batch_size prompts' responses,
// each one optimizer step (clipped by max_grad_norm). Gradients are averaged over the ranks, as
// verl's data-parallel actor does.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/communicator.h"
#include "config/train_config.h"
#include "dataset/token_sequences.h"
#include "models/decoder.h"
#include "parallel/data_parallel.h"
#include "tokenizer/tokenizer.h"
#include "train/batch.h"
#include "train/grpo_loss.h"
#include "train/rewards.h"
#include "train/stage_objective.h"

namespace fab {

// What the stage needs besides the data: the tokenizer that decodes responses and answers, the
// ids that end a response, and the end-of-turn text stripped before comparing.
struct GrpoEnvironment {
  const Tokenizer* tokenizer = nullptr;
  std::vector<int32_t> stop_ids;
  std::string eos_token;
};

// The template's end-of-turn id and text (LLaMA-Factory's eos after replace_eos) end a rollout,
// and the tokenizer's eos too.
GrpoEnvironment grpo_environment(const TrainConfig& config, const Tokenizer& tokenizer);

// A prompt of the dataset: its tokens through the template (up to the assistant turn) and its
// reference answer (the sft response, decoded and stripped).
struct GrpoPrompt {
  std::vector<int32_t> ids;
  std::string answer;
};

// Sequence i of supervised data: its prompt is the tokens before the first target.
std::vector<GrpoPrompt> grpo_prompts(const TokenSequences& rows, const GrpoEnvironment& env);

// One sampled response with what the loss needs of it.
struct RolloutSequence {
  std::vector<int32_t> prompt, response;
  std::vector<double> old_logp, ref_logp;  // per response token
  double advantage = 0;
};

// (B, T) ids and labels of prompt + response, the prompt's labels -100.
Batch collate_rollouts(const std::vector<const RolloutSequence*>& rows, int32_t pad_id);

// Per response token log-probabilities under `model` (no gradient); `entropy_sum` (optional)
// adds each response token's entropy.
std::vector<std::vector<double>> response_logps(DecoderModel& model, const std::vector<const RolloutSequence*>& rows,
                                                int32_t pad_id, double* entropy_sum = nullptr);

// Forward (and, with_grad, backward of scale * loss) of the GRPO loss of `rows`.
GrpoLossResult grpo_minibatch(DecoderModel& model, const std::vector<const RolloutSequence*>& rows,
                              const GrpoLossOptions& options, int32_t pad_id, float scale, bool with_grad);

GrpoLossOptions grpo_loss_options(const TrainConfig& config);

// The sampling seed of one response: a hash of the run's seed, the step, the prompt's index in
// the dataset and the sample's index in its group.
uint64_t rollout_seed(uint64_t seed, int64_t step, int64_t prompt, int64_t sample);

struct GrpoStepResult {
  double loss = 0;       // mean over the step's optimizer updates (and the ranks)
  double grad_norm = 0;  // of the last update
  int64_t tokens = 0;    // prompt + response tokens of the step, every rank
};

class GrpoStage {
 public:
  GrpoStage(const TrainConfig& config, DecoderModel& model, DataParallel& dp, Communicator& group,
            const TokenSequences& train, GrpoEnvironment env, int32_t pad_id);
  ~GrpoStage();
  // Before the first step (and before a resume loads its checkpoint): the reference weights.
  void prepare();
  // Collective. `prompts`: this rank's prompt indices of the step.
  GrpoStepResult step(int64_t step, const std::vector<int64_t>& prompts, double lr);
  // The metrics since the last call, over every rank (collective).
  nlohmann::json metrics_json();
  nlohmann::json memory_json() const;

 private:
  std::vector<RolloutSequence> roll_out(int64_t step, const std::vector<int64_t>& prompts);
  // Forward passes of `per_mini` responses each.
  void reference_logps(std::vector<RolloutSequence>& rollouts, size_t per_mini);
  double update(const std::vector<const RolloutSequence*>& rows, double lr, double* grad_norm);

  TrainConfig config_;
  DecoderModel& model_;
  DataParallel& dp_;
  Communicator& group_;
  std::vector<GrpoPrompt> prompts_;
  GrpoEnvironment env_;
  int32_t pad_id_;
  GrpoLossOptions loss_options_;
  std::unique_ptr<Rewards> rewards_;
  Tensor reference_weights_;  // full and freeze fine-tuning with a KL term: the trainable start weights
  StageMetrics means_;
  std::vector<double> extremes_;  // this rank's max reward, max advantage, -min reward, -min advantage
};

}  // namespace fab
