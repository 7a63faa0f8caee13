#include "train/stages/preference_loss.h"

#include <cmath>

#include "core/error.h"

namespace fab {
namespace {

double sigmoid(double x) { return x >= 0 ? 1.0 / (1.0 + std::exp(-x)) : std::exp(x) / (1.0 + std::exp(x)); }
double log_sigmoid(double x) { return x >= 0 ? -std::log1p(std::exp(-x)) : x - std::log1p(std::exp(x)); }

// The log-probability the loss uses: the sum, or the mean over the response's tokens.
double used_logp(const PrefLossOptions& o, ResponseLogp r) {
  return averages_logps(o.loss) ? r.sum / double(r.tokens) : r.sum;
}

// With x = (c - r) - (c_ref - r_ref) (TRL's "logits"):
//   sigmoid: L = -(1 - ls) log σ(βx) - ls log σ(-βx);  dL/dx = β (-(1 - ls) σ(-βx) + ls σ(βx))
//   hinge:   L = max(0, 1 - βx);                        dL/dx = -β where 1 - βx > 0, else 0
//   ipo:     L = (x - 1/(2β))^2;                        dL/dx = 2 (x - 1/(2β))
// and dL/dc = dL/dx, dL/dr = -dL/dx.
std::pair<double, double> reference_loss(const PrefLossOptions& o, double x) {
  const double b = o.beta, ls = o.label_smoothing;
  switch (o.loss) {
    case PrefLoss::sigmoid:
      return {-(1 - ls) * log_sigmoid(b * x) - ls * log_sigmoid(-b * x),
              b * (-(1 - ls) * sigmoid(-b * x) + ls * sigmoid(b * x))};
    case PrefLoss::hinge: return {std::max(0.0, 1 - b * x), 1 - b * x > 0 ? -b : 0.0};
    case PrefLoss::ipo: return {std::pow(x - 1 / (2 * b), 2), 2 * (x - 1 / (2 * b))};
    default: FAB_CHECK(false, "not a reference loss");
  }
  return {};
}

}  // namespace

PrefLoss parse_pref_loss(const std::string& name) {
  if (name == "sigmoid") return PrefLoss::sigmoid;
  if (name == "hinge") return PrefLoss::hinge;
  if (name == "ipo") return PrefLoss::ipo;
  if (name == "orpo") return PrefLoss::orpo;
  if (name == "simpo") return PrefLoss::simpo;
  throw UserError(format("pref_loss \"{}\": expected sigmoid, hinge, ipo, orpo or simpo", name));
}

bool needs_reference(PrefLoss loss) { return loss != PrefLoss::orpo && loss != PrefLoss::simpo; }
bool averages_logps(PrefLoss loss) { return loss == PrefLoss::ipo || loss == PrefLoss::orpo || loss == PrefLoss::simpo; }

PairResult preference_pair_loss(const PrefLossOptions& o, ResponseLogp chosen, ResponseLogp rejected,
                                ResponseLogp ref_chosen, ResponseLogp ref_rejected) {
  FAB_CHECK(chosen.tokens > 0 && rejected.tokens > 0, "a response without target tokens");
  PairResult p;
  const double c = used_logp(o, chosen), r = used_logp(o, rejected), b = o.beta;
  p.chosen_logp = c;
  p.rejected_logp = r;
  double dc = 0, dr = 0;  // derivatives with respect to c and r
  if (needs_reference(o.loss)) {
    const double cr = used_logp(o, ref_chosen), rr = used_logp(o, ref_rejected);
    const auto [loss, dx] = reference_loss(o, (c - r) - (cr - rr));
    p.loss = loss;
    dc = dx;
    dr = -dx;
    p.chosen_reward = b * (c - cr);
    p.rejected_reward = b * (r - rr);
  } else if (o.loss == PrefLoss::orpo) {
    // log odds: lo = (c - r) - (log(1 - e^c) - log(1 - e^r)); L = -c - β log σ(lo)
    // dlo/dc = 1 / (1 - e^c), dlo/dr = -1 / (1 - e^r), dL/dlo = -β σ(-lo)
    const double lo = (c - r) - (std::log1p(-std::exp(c)) - std::log1p(-std::exp(r)));
    p.loss = -c - b * log_sigmoid(lo);
    const double dlo = -b * sigmoid(-lo);
    dc = -1 + dlo / (1 - std::exp(c));
    dr = -dlo / (1 - std::exp(r));
    p.chosen_reward = b * c;
    p.rejected_reward = b * r;
  } else {  // simpo: L = -log σ(β (c - r) - γ); dL/dc = -β σ(-(β (c - r) - γ)) = -dL/dr
    const double u = b * (c - r) - o.simpo_gamma;
    p.loss = -log_sigmoid(u);
    dc = -b * sigmoid(-u);
    dr = -dc;
    p.chosen_reward = b * c;
    p.rejected_reward = b * r;
  }
  // pref_ftx: + ftx * (-(chosen sum) / tokens), whichever log-probability the loss uses.
  p.loss += o.ftx * -(chosen.sum / double(chosen.tokens));
  const bool avg = averages_logps(o.loss);  // d mean / d sum = 1 / tokens
  p.d_chosen = (avg ? dc / double(chosen.tokens) : dc) - o.ftx / double(chosen.tokens);
  p.d_rejected = avg ? dr / double(rejected.tokens) : dr;
  return p;
}

// desirable:   L = w_d (1 - σ(u)), u = β (logp - ref - kl);  dL/dlogp = -w_d β σ(u) σ(-u)
// undesirable: L = w_u (1 - σ(u)), u = β (kl - logp + ref);  dL/dlogp = +w_u β σ(u) σ(-u)
KtoResult kto_example_loss(const KtoOptions& o, bool desirable, double logp, double ref_logp, double kl) {
  const double ratio = logp - ref_logp, b = o.beta;
  const double u = desirable ? b * (ratio - kl) : b * (kl - ratio);
  const double weight = desirable ? o.desirable_weight : o.undesirable_weight;
  KtoResult k;
  k.loss = weight * (1 - sigmoid(u));
  k.d_logp = (desirable ? -1.0 : 1.0) * weight * b * sigmoid(u) * sigmoid(-u);
  k.reward = b * ratio;
  return k;
}

// L = -log σ(d), d = s_c - s_r; dL/dd = -σ(-d).
RewardPairResult reward_pair_loss(double chosen_score, double rejected_score) {
  const double d = chosen_score - rejected_score;
  return {-log_sigmoid(d), -sigmoid(-d), sigmoid(-d)};
}

}  // namespace fab
