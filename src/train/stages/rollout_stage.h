#pragma once
// stage grpo (and the rollouts stage ppo shares, ppo_stage.h). One trainer step: this rank's per_device_train_batch_size prompts, each sampled
// num_generations times by rollout() on the current weights (seeds from seed, step, prompt and
// sample, so runs reproduce and resume); rewards; group-normalised advantages (each prompt's group
// lives on one rank); the rollout policy's per-token log-probabilities ("old", a forward without
// gradient) and, with kl_loss_coef, the reference's (the starting weights, or the adapters off
// under LoRA), these, the updates' and the entropy metric all of softmax(logits / temperature),
// the distribution sampled from (verl's actor and TRL's GRPOTrainer divide by it too); then ppo_epochs passes over mini-batches of ppo_mini_batch_size prompts' responses,
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
#include "tokenizer/tokenizer.h"
#include "train/batch.h"
#include "train/checkpoint.h"
#include "train/stages/grpo_loss.h"
#include "train/stages/rewards.h"
#include "train/stages/stage.h"

namespace fab {

// The template's end-of-turn id and text (LLaMA-Factory's eos after replace_eos) end a rollout,
// and the tokenizer's eos too.
RolloutEnvironment rollout_environment(const TrainConfig& config, const Tokenizer& tokenizer);

// A prompt of the dataset: its tokens through the template (up to the assistant turn) and its
// reference answer (the sft response, decoded and stripped).
struct RolloutPrompt {
  std::vector<int32_t> ids;
  std::string answer;
  SequenceImages images;  // a vision-language model's prompt images (undefined: text only)
};

// Sequence i of supervised data: its prompt is the tokens before the first target; `images`
// (empty: text data) holds each sequence's images.
std::vector<RolloutPrompt> rollout_prompts(const TokenSequences& rows, const RolloutEnvironment& env,
                                           const std::vector<SequenceImages>& images = {});

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
  SequenceImages images;  // the prompt's (undefined: text only); every forward of the row takes them
  std::vector<double> old_logp, ref_logp;  // per response token
  std::vector<double> rollout_logp;        // per response token, as the rollout engine sampled it
  std::vector<double> is_weight;           // rollout_is: per response token, the importance weight (else empty)
  bool truncated = false;                  // cut at max_new_tokens (no stop id)
  double reward = 0;                       // the sequence's score (with the overlong penalty)
  double advantage = 0;                    // grpo: one per response
  // ppo: per response token, the advantage (used instead of `advantage` when set), the critic's
  // value before the update and the GAE return.
  std::vector<double> token_advantages, values, returns;
};

// Row of the (B * T) positions of collate_rollouts' batch that predicts response token k of
// sequence i: (i, P - 1 + k), P the prompt's length.
int64_t response_row(int64_t i, int64_t seq, const RolloutSequence& r, size_t k);

// (B, T) ids and labels of prompt + response, the prompt's labels -100, and the rows' images.
Batch collate_rollouts(const std::vector<const RolloutSequence*>& rows, int32_t pad_id);

// Per response token log-probabilities under `model` at `temperature` (of softmax(logits /
// temperature); no gradient); `entropy_sum` (optional) adds each response token's entropy of that
// distribution.
std::vector<std::vector<double>> response_logps(DecoderModel& model, const std::vector<const RolloutSequence*>& rows,
                                                int32_t pad_id, double temperature, double* entropy_sum = nullptr);

// The temperature the log-probabilities of a rollout sampled at config.temperature are taken at:
// that temperature (verl, TRL), or 1 for greedy rollouts (temperature 0).
double logp_temperature(const TrainConfig& config);

// What an update's forward measures when the rollout's log-probabilities stand in for the old ones
// (RolloutStage::reuses_rollout_logps): the entropy of its distributions and how far its
// log-probabilities are from the rollout's.
struct RolloutLogpCheck {
  double entropy_sum = 0, tokens = 0, diff_sum = 0, diff_max = 0;
};

// Forward (and, with_grad, backward of scale * loss) of the GRPO loss of `rows`, the policy's
// log-probabilities at options.temperature; with `check`, also the entropy and the difference of
// those log-probabilities from the rows' rollout_logp.
GrpoLossResult grpo_minibatch(DecoderModel& model, const std::vector<const RolloutSequence*>& rows,
                              const GrpoLossOptions& options, int32_t pad_id, float scale, bool with_grad,
                              RolloutLogpCheck* check = nullptr);

GrpoLossOptions grpo_loss_options(const TrainConfig& config);

// The sampling seed of one response: a hash of the run's seed, the step, the prompt's index in
// the dataset and the sample's index in its group.
uint64_t rollout_seed(uint64_t seed, int64_t step, int64_t prompt, int64_t sample);

// verl's masked_whiten of per-token values over every token of every rank's responses (two
// all-reduces over `group`: the sum and count, then the centred squares). Collective.
void whiten_over_ranks(std::vector<std::vector<double>>& values, Communicator& group);

// rollout_is: each response's importance weights (is_weight, truncated at `threshold`) from its old
// and rollout log-probabilities, and the counts of verl's metrics. `batch` gets the sum and number
// of the truncated weights that rollout_is_batch_normalize averages over (tokens, or responses for
// sequence).
RolloutIsCounts set_rollout_is_weights(std::vector<RolloutSequence>& rollouts, RolloutIs level, double threshold,
                                       double batch[2]);

// Responses [first, first + count) of the rollout batch (fewer at its end).
std::vector<const RolloutSequence*> mini_batch(const std::vector<RolloutSequence>& all, size_t first, size_t count);

// What stage grpo and stage ppo share: the rollouts, rewards, old and reference log-probabilities
// and the actor's updates (each one OptimizerStep update); how advantages come about is theirs.
class RolloutStage : public TrainingStage {
 public:
  explicit RolloutStage(const StageContext& context);
  ~RolloutStage() override;
  int64_t items() const override { return int64_t(prompts_.size()); }
  // Before the first step (and before a resume loads its checkpoint): the reference weights.
  void prepare() override;
  // The metrics since the last call, over every rank, and the memory the stage holds. Collective.
  nlohmann::json metrics(bool evaluated) override;

 protected:
  // The step's responses to this rank's next prompts, with their rewards (overlong shaping
  // included) and the reward and response metrics; the step's LoRA dropout masks are chosen first.
  // `draw` > 0: another batch of prompts in the same step (filter_groups), with seeds of its own.
  std::vector<RolloutSequence> roll_out(int64_t step, Sampler& sampler, int64_t draw = 0);
  // Responses per forward pass and per optimizer step: ppo_mini_batch_size prompts' responses.
  size_t per_mini_batch() const;
  // The rollout policy's log-probabilities ("old"), the entropy metric and the difference of the
  // rollout engine's log-probabilities from them (rollout_logp_diff_mean, _max); with rollout_is,
  // the importance weights of the engine's against them. Collective with rollout_is_batch_normalize.
  void old_logps(std::vector<RolloutSequence>& rollouts, size_t per_mini);
  // On-policy with the rollout kernels (one update per rollout batch: ppo_epochs 1, one mini-batch,
  // logp_kernels rollout, no rollout_is, on the CPU, no tensor or pipeline parallel): the rollout engine's log-probabilities are the
  // old ones bit for bit (the tests' rollout_logp_diff_max is 0), so they are taken as they are and
  // the old_log_prob pass is skipped, as TRL skips it when num_iterations is 1. The update's forward,
  // at the rollout's weights, then measures the entropy and rollout_logp_diff.
  bool reuses_rollout_logps(const std::vector<RolloutSequence>& rollouts, size_t per_mini) const;
  void take_rollout_logps(std::vector<RolloutSequence>& rollouts);
  // rollout_is: each response's weights and their metrics (rollout_corr/...), normalised over the
  // ranks with rollout_is_batch_normalize.
  void rollout_correction(std::vector<RolloutSequence>& rollouts);
  // Forward passes of `per_mini` responses each.
  void reference_logps(std::vector<RolloutSequence>& rollouts, size_t per_mini);
  // ppo_epochs passes of actor updates over the mini-batches; the mean loss (NaN when an update was
  // skipped), the last grad norm.
  double actor_updates(int64_t step, const std::vector<RolloutSequence>& rollouts, size_t per_mini, double lr,
                       double* grad_norm);
  // The advantage metrics (mean, max, min) of these values.
  void note_advantages(const std::vector<double>& advantages);
  // Prompt + response tokens of every rank's responses (collective).
  int64_t count_tokens(const std::vector<RolloutSequence>& rollouts);
  UpdateRule actor_rule() const;

  StageContext c_;
  const TrainConfig& config_;
  DecoderModel& model_;
  Communicator& group_;
  std::vector<RolloutPrompt> prompts_;
  const RolloutEnvironment& env_;
  int32_t pad_id_;
  GrpoLossOptions loss_options_;
  std::unique_ptr<Rewards> rewards_;
  bool needs_reference_ = false;  // a KL term (ppo: also the KL penalty in the reward)
  Tensor reference_weights_;  // full and freeze fine-tuning with a KL term: the trainable start weights
  StageMetrics means_;
  // This rank's max reward, max advantage, -min reward, -min advantage, max |rollout - old| log-prob.
  std::vector<double> extremes_;
  bool checking_rollout_logps_ = false;  // this step's update measures entropy and rollout_logp_diff

 private:
  double update(int64_t step, const std::vector<const RolloutSequence*>& rows, double lr, double* grad_norm);
};

// stage grpo: each prompt's group of responses normalised into one advantage per response.
// adv_estimator grpo (with TRL's scale_rewards), rloo or reinforce_plus_plus; filter_groups.
class GrpoStage final : public RolloutStage {
 public:
  using RolloutStage::RolloutStage;
  StepResult step(int64_t step, double lr, Sampler& sampler) override;

 private:
  // DAPO's dynamic sampling: rollout batches until per_device_train_batch_size prompts' groups
  // have rewards that differ, at most max_num_gen_batches; groups past the batch are dropped, and
  // a batch still short is filled with the first all-equal groups (advantage 0 under grpo).
  std::vector<RolloutSequence> filtered_roll_out(int64_t step, Sampler& sampler);
  void set_advantages(std::vector<RolloutSequence>& rollouts);
  // The unbiased std of every rank's rewards (TRL's scale_rewards batch). Collective.
  double batch_reward_std(const std::vector<double>& rewards);
};

}  // namespace fab
