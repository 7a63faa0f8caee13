#include "train/stages/grpo_loss.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "core/error.h"

namespace fab {
namespace {

struct TokenPg {
  double loss = 0, d_logp = 0, neg_kl = 0;
  bool clipped = false, clipped_lower = false;
};

// verl's compute_policy_loss for one token, A the advantage:
//   x = clamp(logp - old, -20, 20), ratio = e^x
//   l1 = -A ratio, l2 = -A clamp(ratio, 1 - lo, 1 + hi), m = max(l1, l2)
//   l3 = -A c; loss = A < 0 ? min(m, l3) : m
// Derivative: d ratio / d logp = ratio inside the clamp, else 0; dl1 = -A ratio'; l2 moves with
// ratio only inside its range, where it equals l1 (torch's max splits a tie's gradient evenly, so
// the sum is dl1 either way); l3 is constant. Ties of m and l3 split evenly too.
TokenPg token_policy_loss(double logp, double old_logp, double a, const GrpoLossOptions& o) {
  TokenPg t;
  const double raw = logp - old_logp;
  const double x = std::clamp(raw, -20.0, 20.0);
  const double ratio = std::exp(x);
  const double d_ratio = (raw >= -20.0 && raw <= 20.0) ? ratio : 0.0;
  t.neg_kl = x;
  const double lo = 1.0 - o.clip_ratio_low, hi = 1.0 + o.clip_ratio_high;
  const double l1 = -a * ratio, l2 = -a * std::clamp(ratio, lo, hi);
  const double dl1 = -a * d_ratio, dl2 = (ratio >= lo && ratio <= hi) ? dl1 : 0.0;
  const double m = std::max(l1, l2);
  const double dm = l1 > l2 ? dl1 : l2 > l1 ? dl2 : 0.5 * (dl1 + dl2);
  t.clipped = l2 > l1;
  t.loss = m;
  t.d_logp = dm;
  if (a < 0) {
    const double l3 = -a * o.clip_ratio_c;
    t.clipped_lower = m > l3;
    t.loss = std::min(m, l3);
    t.d_logp = m < l3 ? dm : m > l3 ? 0.0 : 0.5 * dm;
  }
  return t;
}

// verl's compute_policy_loss_gspo (GSPO-token) for a response, s = exp(min(x, 10)) with x the mean of
// logp - old over its tokens, every token's loss max(-A s, -A clamp(s, 1 - lo, 1 + hi)) (no dual clip).
// Each token's own log-probability carries the ratio (log s_t = logp_t - sg(logp_t) + sg(x)), so
// d s_t / d logp_t = s below the clamp of 10, else 0; the max splits a tie evenly as above. The
// same gradient as TRL's sequence-level ratio exp(x), whose every token's loss moves s by s / n.
std::vector<TokenPg> gspo_policy_loss(const ResponseTokens& r, const GrpoLossOptions& o) {
  const size_t n = r.logp.size();
  double x = 0;
  for (size_t t = 0; t < n; ++t) x += (r.logp[t] - r.old_logp[t]) / double(n);
  const double s = std::exp(std::min(x, 10.0));
  const double d_s = x <= 10.0 ? s : 0.0;
  const double lo = 1.0 - o.clip_ratio_low, hi = 1.0 + o.clip_ratio_high;
  std::vector<TokenPg> out(n);
  for (size_t t = 0; t < n; ++t) {
    const double a = r.token_advantages.empty() ? r.advantage : r.token_advantages[t];
    const double l1 = -a * s, l2 = -a * std::clamp(s, lo, hi);
    const double dl1 = -a * d_s, dl2 = (s >= lo && s <= hi) ? dl1 : 0.0;
    out[t].loss = std::max(l1, l2);
    out[t].d_logp = l1 > l2 ? dl1 : l2 > l1 ? dl2 : 0.5 * (dl1 + dl2);
    out[t].clipped = l2 > l1;
    out[t].neg_kl = r.logp[t] - r.old_logp[t];
  }
  return out;
}

// CISPO (MiniMax-M1): loss = -sg(w) A logp with w = clamp(ratio, 1 - lo, 1 + hi), ratio =
// e^clamp(logp - old, -20, 20); the weight is a constant, so d loss / d logp = -w A for every token,
// clipped or not. pg_clipfrac counts the tokens whose weight was clipped.
TokenPg cispo_token_loss(double logp, double old_logp, double a, const GrpoLossOptions& o) {
  const double x = std::clamp(logp - old_logp, -20.0, 20.0);
  const double ratio = std::exp(x);
  const double w = std::clamp(ratio, 1.0 - o.clip_ratio_low, 1.0 + o.clip_ratio_high);
  TokenPg t;
  t.loss = -w * a * logp;
  t.d_logp = -w * a;
  t.clipped = w != ratio;
  t.neg_kl = x;
  return t;
}

std::vector<TokenPg> response_policy_loss(const ResponseTokens& r, const GrpoLossOptions& o) {
  if (o.policy_loss == PolicyLoss::gspo) return gspo_policy_loss(r, o);
  std::vector<TokenPg> out(r.logp.size());
  for (size_t t = 0; t < r.logp.size(); ++t) {
    const double a = r.token_advantages.empty() ? r.advantage : r.token_advantages[t];
    out[t] = o.policy_loss == PolicyLoss::cispo ? cispo_token_loss(r.logp[t], r.old_logp[t], a, o)
                                                : token_policy_loss(r.logp[t], r.old_logp[t], a, o);
  }
  return out;
}

}  // namespace

std::vector<double> loss_agg_weights(const std::vector<size_t>& lengths, LossAggMode mode, int64_t max_new_tokens) {
  int64_t tokens = 0, nonempty = 0;
  for (size_t n : lengths) {
    tokens += int64_t(n);
    nonempty += n == 0 ? 0 : 1;
  }
  std::vector<double> w(lengths.size(), 0.0);
  for (size_t i = 0; i < lengths.size(); ++i) {
    const double n = double(lengths[i]);
    if (n == 0) continue;
    switch (mode) {
      case LossAggMode::token_mean: w[i] = 1.0 / double(tokens); break;         // Σ l / Σ mask
      case LossAggMode::seq_mean_token_sum: w[i] = 1.0 / double(lengths.size()); break;  // mean_i Σ_t l
      case LossAggMode::seq_mean_token_mean: w[i] = 1.0 / (double(nonempty) * n); break;   // mean_i mean_t l
      case LossAggMode::seq_mean_token_sum_norm:  // Σ_i Σ_t l / (B L)
        w[i] = 1.0 / (double(lengths.size()) * double(max_new_tokens));
        break;
    }
  }
  return w;
}

LossAggMode parse_loss_agg_mode(const std::string& name) {
  if (name == "token-mean") return LossAggMode::token_mean;
  if (name == "seq-mean-token-sum") return LossAggMode::seq_mean_token_sum;
  if (name == "seq-mean-token-mean") return LossAggMode::seq_mean_token_mean;
  if (name == "seq-mean-token-sum-norm") return LossAggMode::seq_mean_token_sum_norm;
  throw UserError(format("loss_agg_mode: expected token-mean, seq-mean-token-sum, seq-mean-token-mean or "
                         "seq-mean-token-sum-norm, got \"{}\"",
                         name));
}

PolicyLoss parse_policy_loss(const std::string& name) {
  if (name == "vanilla") return PolicyLoss::vanilla;
  if (name == "gspo") return PolicyLoss::gspo;
  if (name == "cispo") return PolicyLoss::cispo;
  throw UserError(format("policy_loss: expected vanilla, gspo or cispo, got \"{}\"", name));
}

RolloutIs parse_rollout_is(const std::string& name) {
  if (name.empty()) return RolloutIs::off;
  if (name == "token") return RolloutIs::token;
  if (name == "sequence") return RolloutIs::sequence;
  throw UserError(format("rollout_is: expected token or sequence, or empty, got \"{}\"", name));
}

std::vector<double> rollout_is_weights(const std::vector<double>& old_logp, const std::vector<double>& rollout_logp,
                                       RolloutIs level, double threshold, RolloutIsCounts* counts) {
  FAB_CHECK(old_logp.size() == rollout_logp.size(), "{} old and {} rollout log-probabilities", old_logp.size(),
            rollout_logp.size());
  constexpr double kSafetyBound = 20.0;
  const size_t n = old_logp.size();
  RolloutIsCounts unused;
  RolloutIsCounts& c = counts ? *counts : unused;
  auto count = [&](double weight, double tokens) {
    c.weight_sum += weight * tokens, c.tokens += tokens;
    c.above += weight > threshold ? 1.0 : 0.0, c.below += weight < 1.0 / threshold ? 1.0 : 0.0, c.counted += 1;
  };
  std::vector<double> w(n);
  if (level == RolloutIs::sequence) {
    double sum = 0;
    for (size_t t = 0; t < n; ++t) sum += old_logp[t] - rollout_logp[t];
    const double weight = std::exp(std::clamp(sum, -kSafetyBound, kSafetyBound));
    if (n > 0) count(weight, double(n));
    std::fill(w.begin(), w.end(), std::min(weight, threshold));
    return w;
  }
  for (size_t t = 0; t < n; ++t) {
    const double weight = std::exp(std::clamp(old_logp[t] - rollout_logp[t], -kSafetyBound, kSafetyBound));
    count(weight, 1.0);
    w[t] = std::min(weight, threshold);
  }
  return w;
}

KlType parse_kl_type(const std::string& name) {
  if (name == "k1" || name == "kl") return KlType::k1;
  if (name == "k2" || name == "mse") return KlType::k2;
  if (name == "k3" || name == "low_var_kl") return KlType::k3;
  throw UserError(format("kl_loss_type: expected k1 (kl), k2 (mse) or k3 (low_var_kl), got \"{}\"", name));
}

std::vector<double> group_advantages(const std::vector<double>& rewards, const std::vector<int64_t>& group,
                                     bool norm_by_std, double epsilon) {
  FAB_CHECK(rewards.size() == group.size(), "{} rewards for {} group ids", rewards.size(), group.size());
  std::map<int64_t, std::vector<double>> members;
  for (size_t i = 0; i < rewards.size(); ++i) members[group[i]].push_back(rewards[i]);
  std::map<int64_t, std::pair<double, double>> stats;  // mean, std
  for (const auto& [id, r] : members) {
    if (r.size() == 1) {
      stats[id] = {0.0, 1.0};
      continue;
    }
    double mean = 0, var = 0;
    for (double x : r) mean += x / double(r.size());
    for (double x : r) var += (x - mean) * (x - mean) / double(r.size() - 1);
    stats[id] = {mean, std::sqrt(var)};
  }
  std::vector<double> out(rewards.size());
  for (size_t i = 0; i < rewards.size(); ++i) {
    const auto [mean, std] = stats[group[i]];
    out[i] = norm_by_std ? (rewards[i] - mean) / (std + epsilon) : rewards[i] - mean;
  }
  return out;
}

std::vector<double> batch_scaled_advantages(const std::vector<double>& rewards, const std::vector<int64_t>& group,
                                            double batch_std, double epsilon) {
  std::vector<double> out = group_advantages(rewards, group, false);
  for (double& a : out) a /= batch_std + epsilon;
  return out;
}

std::vector<double> rloo_advantages(const std::vector<double>& rewards, const std::vector<int64_t>& group) {
  std::map<int64_t, std::pair<double, double>> sums;  // Σ r, n
  for (size_t i = 0; i < rewards.size(); ++i) sums[group[i]].first += rewards[i], sums[group[i]].second += 1;
  std::vector<double> out(rewards.size());
  for (size_t i = 0; i < rewards.size(); ++i) {
    const auto [sum, n] = sums[group[i]];
    out[i] = n > 1 ? rewards[i] * n / (n - 1) - (sum / n) * n / (n - 1) : rewards[i];
  }
  return out;
}

std::vector<double> outcome_returns(double score, size_t length, double gamma) {
  std::vector<double> g(length);
  double running = 0;
  for (size_t t = length; t-- > 0;) g[t] = running = (t + 1 == length ? score : 0.0) + gamma * running;
  return g;
}

std::vector<bool> uniform_groups(const std::vector<double>& rewards, const std::vector<int64_t>& group,
                                 int64_t num_groups) {
  std::vector<bool> uniform(size_t(num_groups), true);
  std::vector<bool> seen(size_t(num_groups), false);
  std::vector<double> first(size_t(num_groups), 0.0);
  for (size_t i = 0; i < rewards.size(); ++i) {
    const size_t g = size_t(group[i]);
    FAB_CHECK(group[i] >= 0 && group[i] < num_groups, "group id {} of {} groups", group[i], num_groups);
    if (!seen[g]) seen[g] = true, first[g] = rewards[i];
    else if (rewards[i] != first[g]) uniform[g] = false;
  }
  return uniform;
}

double overlong_penalty(int64_t length, int64_t max_new_tokens, int64_t buffer_len, double penalty_factor) {
  if (buffer_len <= 0) return 0.0;
  const double exceed = double(length - (max_new_tokens - buffer_len));
  return std::min(-exceed / double(buffer_len) * penalty_factor, 0.0);
}

// Derivatives: k1' = 1; k2' = logp - ref; k3 with x = ref - logp: d(e^x - x - 1)/dlogp =
// -(e^x - 1) = 1 - e^x inside both clamps (torch's clamp passes the gradient at its bounds), else 0.
KlTerm kl_penalty(double logp, double ref_logp, KlType type) {
  const double d = logp - ref_logp;
  switch (type) {
    case KlType::k1: return {d, 1.0};
    case KlType::k2: return {0.5 * d * d, d};
    case KlType::k3: {
      const double raw = ref_logp - logp;
      const double x = std::clamp(raw, -20.0, 20.0);
      const double kld = std::exp(x) - x - 1.0;
      const bool live = raw >= -20.0 && raw <= 20.0 && kld >= -10.0 && kld <= 10.0;
      return {std::clamp(kld, -10.0, 10.0), live ? 1.0 - std::exp(x) : 0.0};
    }
  }
  return {};
}

GrpoLossResult grpo_loss(const std::vector<ResponseTokens>& responses, const GrpoLossOptions& o) {
  GrpoLossResult out;
  std::vector<size_t> lengths;
  for (const ResponseTokens& r : responses) lengths.push_back(r.masked ? 0 : r.logp.size());
  const std::vector<double> w = loss_agg_weights(lengths, o.loss_agg_mode, o.max_new_tokens);
  const bool with_kl = o.kl_loss_coef != 0;
  int64_t tokens = 0;
  out.d_logp.resize(responses.size());
  for (size_t i = 0; i < responses.size(); ++i) {
    const ResponseTokens& r = responses[i];
    FAB_CHECK(r.old_logp.size() == r.logp.size() && (!with_kl || r.ref_logp.size() == r.logp.size()) &&
                  (r.token_advantages.empty() || r.token_advantages.size() == r.logp.size()),
              "response {}: {} log-probabilities, {} old, {} reference, {} advantages", i, r.logp.size(),
              r.old_logp.size(), r.ref_logp.size(), r.token_advantages.size());
    out.d_logp[i].assign(r.logp.size(), 0.0);
    if (r.masked) continue;
    FAB_CHECK(r.is_weight.empty() || r.is_weight.size() == r.logp.size(), "response {}: {} importance weights", i,
              r.is_weight.size());
    const std::vector<TokenPg> pgs = response_policy_loss(r, o);
    for (size_t t = 0; t < r.logp.size(); ++t) {
      const TokenPg& pg = pgs[t];
      const double is = r.is_weight.empty() ? 1.0 : r.is_weight[t];  // a constant: d (is l) = is dl
      out.pg_loss += w[i] * is * pg.loss;
      double d = is * pg.d_logp;
      if (with_kl) {
        const KlTerm kl = kl_penalty(r.logp[t], r.ref_logp[t], o.kl_loss_type);
        out.kl_loss += w[i] * kl.value;
        d += o.kl_loss_coef * kl.d_logp;
      }
      out.d_logp[i][t] = w[i] * d;
      out.pg_clipfrac += pg.clipped ? 1.0 : 0.0;
      out.pg_clipfrac_lower += pg.clipped_lower ? 1.0 : 0.0;
      out.ppo_kl += -pg.neg_kl;
      ++tokens;
    }
  }
  out.loss = out.pg_loss + o.kl_loss_coef * out.kl_loss;
  if (tokens > 0) {
    out.pg_clipfrac /= double(tokens);
    out.pg_clipfrac_lower /= double(tokens);
    out.ppo_kl /= double(tokens);
  }
  return out;
}

}  // namespace fab
