#pragma once
// The GRPO objective with verl's semantics and names (verl/trainer/ppo/core_algos.py): group-
// normalised advantages, PPO's clipped surrogate with dual-clip, the three loss aggregations, and
// the KL penalty to the reference, each with its derivative with respect to the policy's per-token
// log-probabilities (the model's backward takes it from there).
#include <cstdint>
#include <string>
#include <vector>

namespace fab {

enum class LossAggMode { token_mean, seq_mean_token_sum, seq_mean_token_mean };
enum class KlType { k1, k2, k3 };

LossAggMode parse_loss_agg_mode(const std::string& name);  // UserError for other names
// k1 (verl: kl), k2 (mse), k3 (low_var_kl); UserError for other names.
KlType parse_kl_type(const std::string& name);

// verl's compute_grpo_outcome_advantage: per group of responses to one prompt,
// (r - mean) / (std + epsilon) with the unbiased std, or r - mean when !norm_by_std (Dr. GRPO).
// A group of one has mean 0 and std 1, as verl sets them. `group[i]`: response i's prompt.
std::vector<double> group_advantages(const std::vector<double>& rewards, const std::vector<int64_t>& group,
                                     bool norm_by_std, double epsilon = 1e-6);

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
};

// verl's agg_loss as weights: aggregate = Σ_i w_i Σ_t l_it over responses of these lengths.
//   token-mean: 1 / Σ_i n_i   seq-mean-token-sum: 1 / B   seq-mean-token-mean: 1 / (B' n_i), B' the
//   nonempty responses (an empty response weighs 0).
std::vector<double> loss_agg_weights(const std::vector<size_t>& lengths, LossAggMode mode);

struct GrpoLossResult {
  double loss = 0;                         // pg_loss + kl_loss_coef * kl_loss
  double pg_loss = 0, kl_loss = 0;         // each aggregated by loss_agg_mode
  double pg_clipfrac = 0, pg_clipfrac_lower = 0, ppo_kl = 0;  // token means, as verl logs them
  std::vector<std::vector<double>> d_logp;  // dloss / d logp of every token of every response
};

// The loss of a mini-batch of responses, aggregated over them as loss_agg_mode says.
GrpoLossResult grpo_loss(const std::vector<ResponseTokens>& responses, const GrpoLossOptions& options);

}  // namespace fab
