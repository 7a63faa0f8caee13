#pragma once
// stage ppo: verl's PPO with a critic (adv_estimator gae). One trainer step: the rollouts, rewards
// and old (and reference) log-probabilities of stage grpo, at the rollout temperature
// (num_generations defaults to 1); the critic's values of every response token (no gradient);
// token-level rewards (the score on the last token, minus kl_coef * KL(rollout policy, reference)
// per token under use_kl_in_reward);
// GAE with gamma and lam, returns = advantages + values, the advantages whitened over every
// response token of the step on every rank; then ppo_epochs passes over the mini-batches updating
// the critic (clipped value loss, its own AdamW and critic_max_grad_norm) and then, from step
// critic_warmup on, the actor (grpo's clipped surrogate with these per-token advantages), as
// verl's trainer orders them.
//
// The critic is a second decoder with a value head read at every response position (the state
// before each response token, as verl's critic reads values[:, -R - 1 : -1]). It starts from
// critic_model_path (an HF folder, or a stage rm output whose value head it keeps), else from the
// actor's start weights; a folder without a value head gives it a zero one, so the first values
// are 0 and the first advantages the plain returns. It trains in full whatever the actor's
// finetuning_type, is data parallel over the same ranks (ZeRO 0-2 as the actor), keeps the actor's
// precision, and rides the actor's learning-rate schedule scaled to critic_learning_rate.
// Checkpoints hold it in checkpoint-N/critic/ (weights, value head, AdamW moments); the final
// one goes to output_dir/critic/.
#include <memory>
#include <string>
#include <vector>

#include "train/stages/rollout_stage.h"
#include "train/stages/ppo_loss.h"

namespace fab {

// The critic's start: critic_model_path or model_name_or_path, the actor's options but full
// fine-tuning and a value head (zero when the folder has none).
std::unique_ptr<DecoderModel> make_critic(const TrainConfig& config, const DecoderModel& actor);

// The critic's value at every response token of `rows` (no gradient).
std::vector<std::vector<double>> response_values(DecoderModel& critic, const std::vector<const RolloutSequence*>& rows,
                                                 int32_t pad_id);

// Forward (and, with_grad, backward of scale * vf_loss) of the value loss of `rows`, whose values
// and returns are set.
ValueLossResult value_minibatch(DecoderModel& critic, const std::vector<const RolloutSequence*>& rows,
                                const ValueLossOptions& options, int32_t pad_id, float scale, bool with_grad);

// GAE over the step's responses (rewards, old and reference log-probs and values set): their
// returns and whitened per-token advantages, the whitening's moments summed over `group`.
// `kl_sum` (optional) adds each response's mean KL of the reward's penalty.
void set_advantages(std::vector<RolloutSequence>& rollouts, const TrainConfig& config, Communicator& group,
                    double* kl_sum = nullptr);

class PpoStage final : public RolloutStage {
 public:
  explicit PpoStage(const StageContext& context);
  ~PpoStage() override;
  StepResult step(int64_t step, double lr, Sampler& sampler) override;
  nlohmann::json metrics(bool evaluated) override;
  void save_part(const std::string& dir, const TrainerState& state, const std::string& yaml) override;
  void load_part(const std::string& dir) override;
  void save_final(const std::string& output_dir) override;

 private:
  void critic_values(std::vector<RolloutSequence>& rollouts, size_t per_mini);
  void critic_update(int64_t step, const std::vector<const RolloutSequence*>& rows, double lr);

  std::unique_ptr<ParallelModel> critic_;  // data parallel over the actor's data-parallel group
  ValueLossOptions value_options_;
  StageMetrics critic_means_;
};

}  // namespace fab
