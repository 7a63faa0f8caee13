#include "train/stages/ppo_loss.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace fab {
namespace {

// torch's max(a, b) and min(a, b) pass the gradient to the larger (smaller) one, half to each at a tie.
double tie_share(double mine, double other) { return mine > other ? 1.0 : mine < other ? 0.0 : 0.5; }

struct TokenValueLoss {
  double loss = 0, d_vpred = 0;
  bool clipped = false;
};

// One token, v = vpred, V = values, R = returns, e = cliprange_value:
//   vclip = max(min(v, V + e), V - e)   (verl's clip_by_value)
//   l1 = (v - R)^2, l2 = (vclip - R)^2, loss = max(l1, l2)
// Derivative: dl1/dv = 2 (v - R); dl2/dv = 2 (vclip - R) dvclip/dv, with dvclip/dv = 1 inside
// (V - e, V + e), 0 outside, and torch's half at either bound (min, then max, split a tie);
// dloss/dv = the larger one's derivative (half of each at a tie).
TokenValueLoss token_value_loss(double v, double values, double ret, double e) {
  const double hi = values + e, lo = values - e;
  const double upper = std::min(v, hi), vclip = std::max(upper, lo);
  const double d_upper = tie_share(hi, v);
  const double d_vclip = d_upper * tie_share(upper, lo);
  const double l1 = (v - ret) * (v - ret), l2 = (vclip - ret) * (vclip - ret);
  const double dl1 = 2 * (v - ret), dl2 = 2 * (vclip - ret) * d_vclip;
  TokenValueLoss t;
  t.loss = std::max(l1, l2);
  t.d_vpred = tie_share(l1, l2) * dl1 + tie_share(l2, l1) * dl2;
  t.clipped = l2 > l1;
  return t;
}

}  // namespace

std::vector<double> token_rewards(double score, size_t length, const std::vector<double>& old_logp,
                                  const std::vector<double>& ref_logp, double kl_coef, KlType kl_type,
                                  double* kl_sum) {
  FAB_CHECK(length > 0, "token_rewards of an empty response");
  std::vector<double> r(length, 0.0);
  r.back() = score;
  if (ref_logp.empty()) return r;
  FAB_CHECK(old_logp.size() == length && ref_logp.size() == length, "{} tokens, {} old and {} reference log-probs",
            length, old_logp.size(), ref_logp.size());
  for (size_t t = 0; t < length; ++t) {
    const double kl = kl_penalty(old_logp[t], ref_logp[t], kl_type).value;
    r[t] -= kl_coef * kl;
    if (kl_sum) *kl_sum += kl;
  }
  return r;
}

Gae gae(const std::vector<double>& rewards, const std::vector<double>& values, double gamma, double lam) {
  FAB_CHECK(rewards.size() == values.size(), "gae: {} rewards, {} values", rewards.size(), values.size());
  const size_t n = rewards.size();
  Gae out{std::vector<double>(n), std::vector<double>(n)};
  double next_value = 0, next_advantage = 0;
  for (size_t k = n; k-- > 0;) {
    const double delta = rewards[k] + gamma * next_value - values[k];
    next_advantage = delta + gamma * lam * next_advantage;
    next_value = values[k];
    out.advantages[k] = next_advantage;
    out.returns[k] = next_advantage + values[k];
  }
  return out;
}

double moments_mean(const TokenMoments& m) { return m.count > 0 ? m.sum / m.count : 0.0; }

double moments_unbiased_variance(const TokenMoments& m) {
  if (m.count < 2) return 0.0;
  return m.centered_squares / m.count * (m.count / (m.count - 1));  // masked_var's Bessel correction
}

void whiten(std::vector<std::vector<double>>& advantages, double mean, double variance) {
  const double scale = 1.0 / std::sqrt(variance + 1e-8);
  for (auto& response : advantages)
    for (double& a : response) a = (a - mean) * scale;
}

void masked_whiten(std::vector<std::vector<double>>& advantages) {
  TokenMoments m;
  for (const auto& response : advantages)
    for (double a : response) m.sum += a, m.count += 1;
  const double mean = moments_mean(m);
  for (const auto& response : advantages)
    for (double a : response) m.centered_squares += (a - mean) * (a - mean);
  whiten(advantages, mean, moments_unbiased_variance(m));
}

ValueLossResult value_loss(const std::vector<ValueTokens>& responses, const ValueLossOptions& o) {
  ValueLossResult out;
  std::vector<size_t> lengths;
  for (const ValueTokens& r : responses) lengths.push_back(r.vpred.size());
  const std::vector<double> w = loss_agg_weights(lengths, o.loss_agg_mode);
  double tokens = 0;
  out.d_vpred.resize(responses.size());
  for (size_t i = 0; i < responses.size(); ++i) {
    const ValueTokens& r = responses[i];
    FAB_CHECK(r.values.size() == r.vpred.size() && r.returns.size() == r.vpred.size(),
              "response {}: {} predictions, {} values, {} returns", i, r.vpred.size(), r.values.size(),
              r.returns.size());
    out.d_vpred[i].assign(r.vpred.size(), 0.0);
    for (size_t t = 0; t < r.vpred.size(); ++t) {
      const TokenValueLoss l = token_value_loss(r.vpred[t], r.values[t], r.returns[t], o.cliprange_value);
      out.vf_loss += 0.5 * w[i] * l.loss;  // d(0.5 w l)/dv = 0.5 w dl/dv
      out.d_vpred[i][t] = 0.5 * w[i] * l.d_vpred;
      out.vf_clipfrac += l.clipped ? 1.0 : 0.0;
      out.vpred_mean += r.vpred[t];
      tokens += 1;
    }
  }
  if (tokens > 0) {
    out.vf_clipfrac /= tokens;
    out.vpred_mean /= tokens;
  }
  return out;
}

}  // namespace fab
