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
#include <functional>
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
#include "train/checkpoint.h"
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
  std::function<int()> stop_signal;  // non-zero once a stop signal arrived (ends a running reward command)
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

// The most tokens of any prompt of `rows` (the tokens before its first target).
int64_t longest_prompt(const TokenSequences& rows);

// A rollout is a prompt and up to max_new_tokens more, within the model's context: as `fabrica
// generate` checks it, max_new_tokens plus the longest prompt must fit `context` (the model's
// max_position_embeddings). A UserError naming both otherwise; `rows` empty checks max_new_tokens
// against a one-token prompt (before the data is read).
void check_rollout_context(const TrainConfig& config, int64_t context, const TokenSequences* rows);

// One sampled response with what the loss needs of it.
struct RolloutSequence {
  std::vector<int32_t> prompt, response;
  std::vector<double> old_logp, ref_logp;  // per response token
  double reward = 0;                       // the sequence's score
  double advantage = 0;                    // grpo: one per response
  // ppo: per response token, the advantage (used instead of `advantage` when set), the critic's
  // value before the update and the GAE return.
  std::vector<double> token_advantages, values, returns;
};

// Row of the (B * T) positions of collate_rollouts' batch that predicts response token k of
// sequence i: (i, P - 1 + k), P the prompt's length.
int64_t response_row(int64_t i, int64_t seq, const RolloutSequence& r, size_t k);

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

// Responses [first, first + count) of the rollout batch (fewer at its end).
std::vector<const RolloutSequence*> mini_batch(const std::vector<RolloutSequence>& all, size_t first, size_t count);

// stage grpo, and the base of stage ppo (train/ppo_stage.h), which shares its rollouts, rewards,
// old and reference log-probabilities and actor updates and adds a critic.
class GrpoStage {
 public:
  GrpoStage(const TrainConfig& config, DecoderModel& model, DataParallel& dp, Communicator& group,
            const TokenSequences& train, GrpoEnvironment env, int32_t pad_id);
  virtual ~GrpoStage();
  // Before the first step (and before a resume loads its checkpoint): the reference weights.
  void prepare();
  // Collective. `prompts`: this rank's prompt indices of the step.
  virtual GrpoStepResult step(int64_t step, const std::vector<int64_t>& prompts, double lr);
  // The metrics since the last call, over every rank (collective).
  virtual nlohmann::json metrics_json();
  virtual nlohmann::json memory_json() const;
  // What the stage trains besides the model (ppo: the critic), into and out of checkpoint `dir`
  // after the trainer's own part (collective), and into the final output_dir.
  virtual void save_checkpoint_part(const std::string& /*dir*/, const TrainerState& /*state*/,
                                    const std::string& /*config_yaml*/) {}
  virtual void load_checkpoint_part(const std::string& /*dir*/) {}
  virtual void save_final(const std::string& /*output_dir*/, bool /*main*/) {}

 protected:
  // The step's responses with their rewards (and the reward and response metrics).
  std::vector<RolloutSequence> roll_out(int64_t step, const std::vector<int64_t>& prompts);
  // Responses per forward pass and per optimizer step: ppo_mini_batch_size prompts' responses.
  size_t per_mini_batch() const;
  // The rollout policy's log-probabilities ("old") and the entropy metric.
  void old_logps(std::vector<RolloutSequence>& rollouts, size_t per_mini);
  // Forward passes of `per_mini` responses each.
  void reference_logps(std::vector<RolloutSequence>& rollouts, size_t per_mini);
  // ppo_epochs passes of actor updates over the mini-batches; the mean loss, the last grad norm.
  double actor_updates(const std::vector<RolloutSequence>& rollouts, size_t per_mini, double lr, double* grad_norm);
  double update(const std::vector<const RolloutSequence*>& rows, double lr, double* grad_norm);
  // Stops the run (a UserError) at a non-finite loss or gradient norm: "stage S: step N: WHAT:
  // stopping, saving nothing new; the last checkpoint is ...", with `advice`.
  [[noreturn]] void stop_not_finite(const std::string& what, const std::string& advice) const;
  // The ranks, "0, 2", whose flag (one slot per rank) is set.
  static std::string flagged_ranks(const std::vector<double>& flags);
  // The advantage metrics (mean, max, min) of these values.
  void note_advantages(const std::vector<double>& advantages);
  // Prompt + response tokens of every rank's responses (collective).
  int64_t count_tokens(const std::vector<RolloutSequence>& rollouts);

  TrainConfig config_;
  DecoderModel& model_;
  DataParallel& dp_;
  Communicator& group_;
  std::vector<GrpoPrompt> prompts_;
  GrpoEnvironment env_;
  int32_t pad_id_;
  GrpoLossOptions loss_options_;
  std::unique_ptr<Rewards> rewards_;
  bool needs_reference_ = false;  // a KL term (ppo: also the KL penalty in the reward)
  Tensor reference_weights_;  // full and freeze fine-tuning with a KL term: the trainable start weights
  StageMetrics means_;
  std::vector<double> extremes_;  // this rank's max reward, max advantage, -min reward, -min advantage
  int64_t step_ = 0;              // the step being run (0-based), for messages
};

}  // namespace fab
