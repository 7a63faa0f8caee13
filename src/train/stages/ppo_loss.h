#pragma once
// The critic side of stage ppo with verl's semantics and names (verl/trainer/ppo/core_algos.py,
// adv_estimator gae): token-level rewards with the KL penalty in the reward, generalised advantage
// estimation over a response's tokens, masked whitening of the advantages over a batch, and the
// clipped value loss with its derivative with respect to the critic's per-token values (the value
// head's backward, nn/sequence_logps.h row_scores, takes it from there).
#include <cstdint>
#include <vector>

#include "train/stages/grpo_loss.h"

namespace fab {

// verl's token_level_rewards of one response: the sequence's score on its last token, minus
// kl_coef * kl_penalty(old_logp, ref_logp) on every token when ref_logp is given (use_kl_in_reward).
// `kl_sum` (optional) adds the response's per-token KL values (actor/reward_kl_penalty).
std::vector<double> token_rewards(double score, size_t length, const std::vector<double>& old_logp,
                                  const std::vector<double>& ref_logp, double kl_coef, KlType kl_type,
                                  double* kl_sum = nullptr);

// verl's compute_gae_advantage_return on one response (its tokens only; padding after them takes
// no part). Backwards over t with V_T = 0 and A_T = 0:
//   delta_t = r_t + gamma V_{t+1} - V_t,   A_t = delta_t + gamma lam A_{t+1},   R_t = A_t + V_t.
struct Gae {
  std::vector<double> advantages, returns;
};
Gae gae(const std::vector<double>& rewards, const std::vector<double>& values, double gamma, double lam);

// verl's masked_whiten (shift_mean true) over every token of a batch, from its moments:
// (a - mean) / sqrt(var + 1e-8), var the unbiased variance (n / (n - 1) times the mean square of
// a - mean). verl raises on a batch of one token; here its one advantage is 0 (a - mean), whatever
// the variance.
struct TokenMoments {
  double sum = 0, count = 0, centered_squares = 0;  // Σ a, n, Σ (a - mean)^2
};
double moments_mean(const TokenMoments& m);
double moments_unbiased_variance(const TokenMoments& m);
void whiten(std::vector<std::vector<double>>& advantages, double mean, double variance);
// The same on one process: the batch's own moments.
void masked_whiten(std::vector<std::vector<double>>& advantages);

struct ValueLossOptions {
  double cliprange_value = 0.5;  // verl's critic.cliprange_value
  LossAggMode loss_agg_mode = LossAggMode::token_mean;
};

// One response: the critic's values now (vpred), before the update (values: the clip's centre)
// and the GAE returns, per token.
struct ValueTokens {
  std::vector<double> vpred, values, returns;
};

struct ValueLossResult {
  double vf_loss = 0;                        // 0.5 * agg(max((v - R)^2, (vclip - R)^2))
  double vf_clipfrac = 0;                    // token mean of (vclip - R)^2 > (v - R)^2
  double vpred_mean = 0;                     // token mean of vpred
  std::vector<std::vector<double>> d_vpred;  // d vf_loss / d vpred of every token
};

// verl's compute_value_loss over a mini-batch of responses.
ValueLossResult value_loss(const std::vector<ValueTokens>& responses, const ValueLossOptions& options);

}  // namespace fab
