#pragma once
// The GRPO objective with verl's semantics and names (verl/trainer/ppo/core_algos.py): group-
// normalised advantages, PPO's clipped surrogate with dual-clip, the three loss aggregations, and
// the KL penalty to the reference, each with its derivative with respect to the policy's per-token
// log-probabilities (the model's backward takes it from there).
#include <cstdint>
#include <string>
#include <vector>

namespace fab {

// seq_mean_token_sum_norm: Dr. GRPO's Σ_i Σ_t l / (B · max_new_tokens), as TRL's loss_type dr_grpo.
enum class LossAggMode { token_mean, seq_mean_token_sum, seq_mean_token_mean, seq_mean_token_sum_norm };
enum class KlType { k1, k2, k3 };
// vanilla: PPO's per-token clipped ratio with dual clip (verl's vanilla); gspo: the length-normalised
// sequence ratio, clipped once per response (verl's gspo, TRL's importance_sampling_level sequence);
// cispo: the clipped, stop-gradient ratio times the log-probability (MiniMax-M1, verl's and TRL's cispo).
enum class PolicyLoss { vanilla, gspo, cispo };

LossAggMode parse_loss_agg_mode(const std::string& name);  // UserError for other names
PolicyLoss parse_policy_loss(const std::string& name);     // UserError for other names
// k1 (verl: kl), k2 (mse), k3 (low_var_kl); UserError for other names.
KlType parse_kl_type(const std::string& name);

// verl's compute_grpo_outcome_advantage: per group of responses to one prompt,
// (r - mean) / (std + epsilon) with the unbiased std, or r - mean when !norm_by_std (Dr. GRPO).
// A group of one has mean 0 and std 1, as verl sets them. `group[i]`: response i's prompt.
std::vector<double> group_advantages(const std::vector<double>& rewards, const std::vector<int64_t>& group,
                                     bool norm_by_std, double epsilon = 1e-6);

// TRL's scale_rewards "batch": r - the group's mean, over (the std of every reward of the batch +
// epsilon), the std unbiased; `batch_std` is that std (taken over every rank by the caller).
std::vector<double> batch_scaled_advantages(const std::vector<double>& rewards, const std::vector<int64_t>& group,
                                            double batch_std, double epsilon);

// verl's compute_rloo_outcome_advantage: in a group of n > 1, r_i n/(n-1) - mean n/(n-1) (r_i less
// the mean of the others); a group of one keeps its reward.
std::vector<double> rloo_advantages(const std::vector<double>& rewards, const std::vector<int64_t>& group);

// verl's REINFORCE++ returns of one response of `length` tokens whose score sits on its last token:
// returns_t = score γ^(length-1-t) (the stage then whitens them over the batch's tokens).
std::vector<double> outcome_returns(double score, size_t length, double gamma);

// The groups (ids of `group`) whose rewards are all equal: DAPO's dynamic sampling drops them.
std::vector<bool> uniform_groups(const std::vector<double>& rewards, const std::vector<int64_t>& group,
                                 int64_t num_groups);

// DAPO's overlong reward shaping (verl's DAPORewardManager): a response of `length` tokens past
// max_new_tokens - buffer_len gets min(-(length - (max_new_tokens - buffer_len)) / buffer_len *
// penalty_factor, 0) added to its reward.
double overlong_penalty(int64_t length, int64_t max_new_tokens, int64_t buffer_len, double penalty_factor);

// verl's kl_penalty of one token and its derivative with respect to logp.
//   k1: logp - ref            k2: (logp - ref)^2 / 2
//   k3: e^x - x - 1 with x = clamp(ref - logp, -20, 20), the result clamped to [-10, 10]
struct KlTerm {
  double value = 0, d_logp = 0;
};
KlTerm kl_penalty(double logp, double ref_logp, KlType type);

struct GrpoLossOptions {
  double clip_ratio_low = 0.2, clip_ratio_high = 0.2;
  double clip_ratio_c = 3.0;  // dual-clip: the loss of a negative advantage is at most -A * c
  LossAggMode loss_agg_mode = LossAggMode::token_mean;
  PolicyLoss policy_loss = PolicyLoss::vanilla;
  int64_t max_new_tokens = 0;  // seq-mean-token-sum-norm's constant length
  bool mask_truncated_completions = false;  // grpo_minibatch masks the responses cut at max_new_tokens
  double kl_loss_coef = 0.0;  // 0: no KL term (verl's use_kl_loss false)
  KlType kl_loss_type = KlType::k3;
  // The policy's log-probabilities are of softmax(logits / temperature), the distribution the
  // rollouts were sampled from (verl's actor and TRL's GRPOTrainer divide by the rollout temperature).
  double temperature = 1.0;
};

// One response: the policy's, the rollout policy's ("old") and the reference's log-probability of
// each of its tokens, and its advantage.
struct ResponseTokens {
  std::vector<double> logp, old_logp, ref_logp;  // ref_logp may be empty when kl_loss_coef is 0
  double advantage = 0;
  std::vector<double> token_advantages;  // ppo (GAE): one per token, used instead of `advantage` when set
  // rollout_is: each token's importance weight, a constant multiplying its policy loss (not the KL
  // term), as verl's pg_losses * rollout_is_weights; empty: 1.
  std::vector<double> is_weight;
  bool masked = false;  // mask_truncated_completions: a cut response takes no part in the loss (0 tokens)
};

// Rollout correction (verl's compute_rollout_correction_weights): the importance weights of one
// response's tokens from its training-forward ("old") and rollout log-probabilities, x_t = old_t -
// rollout_t. token: w_t = min(e^clamp(x_t, -20, 20), threshold); sequence: every token's w =
// min(e^clamp(Σ_t x_t, -20, 20), threshold).
enum class RolloutIs { off, token, sequence };
RolloutIs parse_rollout_is(const std::string& name);  // "" off, token, sequence; UserError otherwise
// What verl's metrics count, before the truncation: the sum of the weights over tokens (the
// mean's numerator, rollout_is_mean), and how many weights -- per token, or once per response for
// sequence -- were above threshold or below 1 / threshold (rollout_is_ratio_fraction_high / _low).
struct RolloutIsCounts {
  double weight_sum = 0, tokens = 0;
  double above = 0, below = 0, counted = 0;
};
std::vector<double> rollout_is_weights(const std::vector<double>& old_logp, const std::vector<double>& rollout_logp,
                                       RolloutIs level, double threshold, RolloutIsCounts* counts = nullptr);

// verl's agg_loss as weights: aggregate = Σ_i w_i Σ_t l_it over responses of these lengths.
//   token-mean: 1 / Σ_i n_i   seq-mean-token-sum: 1 / B   seq-mean-token-mean: 1 / (B' n_i), B' the
//   nonempty responses (an empty response weighs 0)   seq-mean-token-sum-norm: 1 / (B max_new_tokens).
std::vector<double> loss_agg_weights(const std::vector<size_t>& lengths, LossAggMode mode, int64_t max_new_tokens = 0);

struct GrpoLossResult {
  double loss = 0;                         // pg_loss + kl_loss_coef * kl_loss
  double pg_loss = 0, kl_loss = 0;         // each aggregated by loss_agg_mode
  double pg_clipfrac = 0, pg_clipfrac_lower = 0, ppo_kl = 0;  // token means, as verl logs them
  std::vector<std::vector<double>> d_logp;  // dloss / d logp of every token of every response
};

// The loss of a mini-batch of responses, aggregated over them as loss_agg_mode says.
GrpoLossResult grpo_loss(const std::vector<ResponseTokens>& responses, const GrpoLossOptions& options);

}  // namespace fab
