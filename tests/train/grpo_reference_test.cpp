// stage grpo's objective against tests/reference/make_grpo_reference.py (PyTorch autograd over
// verl's formulas): on a fixed batch of rollouts of the reference's tiny Llama, the loss and every
// parameter gradient within 1e-5 for each loss_agg_mode and KL type, the log-probabilities of
// softmax(logits / temperature) at a rollout temperature of 0.7 (and one case at 1), as verl's
// actor and TRL's GRPOTrainer take them; the per-token log-probabilities and entropies at 0.7; the
// group advantages of groups of 1, 2 and 8 as verl computes them. Issue 31: GSPO (against TRL's
// sequence-level ratio, every clip reached), CISPO, Dr. GRPO's normalisation and
// mask_truncated_completions, each loss and every gradient; rloo, TRL's scale_rewards, REINFORCE++
// and DAPO's overlong penalty and group filter; verl's rollout correction (token- and
// sequence-level truncated importance weights, batch normalisation) on the policy loss.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "io/safetensors.h"
#include "models/hf_model.h"
#include "train/stages/ppo_loss.h"
#include "train/stages/rollout_stage.h"
#include "test_util.h"

namespace fab {
namespace {

std::string fixture_dir() { return test::reference_dir() + "/grpo"; }

bool have_fixture() { return std::filesystem::exists(fixture_dir() + "/reference.safetensors"); }

struct GrpoFixture {
  SafetensorsFile ref = SafetensorsFile::open(fixture_dir() + "/reference.safetensors");
  std::vector<RolloutSequence> rollouts;

  explicit GrpoFixture(const std::string& old_name = "old_logp", const std::string& rollout_name = "") {
    const Tensor ids = ref.tensor("ids"), old = ref.tensor(old_name), reference = ref.tensor("ref_logp");
    const Tensor rollout = rollout_name.empty() ? Tensor() : ref.tensor(rollout_name);
    const Tensor truncated = ref.tensor("truncated");
    const Tensor prompts = ref.tensor("prompt_lengths"), responses = ref.tensor("response_lengths");
    const Tensor adv = ref.tensor("advantages");
    const int64_t t = ids.dim(1);
    for (int64_t i = 0; i < ids.dim(0); ++i) {
      RolloutSequence r;
      const int64_t p = prompts.data<int64_t>()[i], n = responses.data<int64_t>()[i];
      for (int64_t k = 0; k < p + n; ++k) (k < p ? r.prompt : r.response).push_back(int32_t(ids.data<int64_t>()[i * t + k]));
      for (int64_t k = 0; k < n; ++k) {  // target position p - 1 + k predicts response token k
        r.old_logp.push_back(old.data<float>()[i * (t - 1) + p - 1 + k]);
        r.ref_logp.push_back(reference.data<float>()[i * (t - 1) + p - 1 + k]);
        if (rollout.defined()) r.rollout_logp.push_back(rollout.data<float>()[i * (t - 1) + p - 1 + k]);
      }
      r.advantage = adv.data<float>()[i];
      r.truncated = truncated.data<int64_t>()[i] != 0;
      rollouts.push_back(std::move(r));
    }
  }

  double meta(const std::string& key) const { return std::stod(ref.metadata().at(key)); }
  nlohmann::json json(const std::string& key) const { return nlohmann::json::parse(ref.metadata().at(key)); }
  std::vector<const RolloutSequence*> rows() const {
    std::vector<const RolloutSequence*> out;
    for (const RolloutSequence& r : rollouts) out.push_back(&r);
    return out;
  }
};

class GrpoReference : public ::testing::TestWithParam<std::string> {};

// A case name's parts: "gspo.token-mean.none" -> {"gspo", "token-mean", "none"}.
std::vector<std::string> dotted_parts(const std::string& name) {
  std::vector<std::string> part;
  for (size_t at = 0, dot; at <= name.size(); at = dot + 1) {
    dot = std::min(name.find('.', at), name.size());
    part.push_back(name.substr(at, dot - at));
  }
  return part;
}

GrpoLossOptions fixture_options(const GrpoFixture& f, const std::string& kl) {
  GrpoLossOptions o;
  o.temperature = f.meta("temperature");
  o.clip_ratio_low = f.meta("clip_ratio_low");
  o.clip_ratio_high = f.meta("clip_ratio_high");
  o.clip_ratio_c = f.meta("clip_ratio_c");
  o.kl_loss_coef = kl == "none" ? 0.0 : f.meta("kl_loss_coef");
  if (kl != "none") o.kl_loss_type = parse_kl_type(kl);
  return o;
}

// The loss, the clip fractions and every parameter's gradient of case `name` against the fixture,
// with the training kernels and with the rollout engine's in the forward (logp_kernels rollout).
void expect_case(const GrpoFixture& f, const std::string& name, const GrpoLossOptions& o) {
  for (const bool rollout_kernels : {false, true}) {
    const std::string what = name + (rollout_kernels ? " (rollout kernels)" : "");
    auto model = load_model_folder(fixture_dir(), DecoderOptions{});
    model->set_rollout_kernels(rollout_kernels);
    model->params().grads().zero_();
    const GrpoLossResult r = grpo_minibatch(*model, f.rows(), o, 0, 1.0f, true);
    const nlohmann::json want = f.json(name);
    EXPECT_NEAR(r.loss, want["loss"].get<double>(), 1e-5 * std::max(1.0, std::fabs(want["loss"].get<double>()))) << what;
    EXPECT_NEAR(r.pg_clipfrac, want["pg_clipfrac"].get<double>(), 1e-12) << what;
    EXPECT_NEAR(r.pg_clipfrac_lower, want["pg_clipfrac_lower"].get<double>(), 1e-12) << what;
    for (const ParamInfo& p : model->params().params())
      test::expect_close(model->params().grads().view(p.offset, p.shape), f.ref.tensor(name + ".grad." + p.name), 1e-5,
                         what + " grad " + p.name);
  }
}

TEST_P(GrpoReference, LossAndEveryGradientMatchPyTorch) {
  if (!have_fixture()) GTEST_SKIP() << "no fixture: run tests/reference/make_grpo_reference.py (make test does)";
  const GrpoFixture f;
  const std::string name = GetParam();
  const size_t dot = name.find('.'), at = name.find('@');
  GrpoLossOptions o = fixture_options(f, name.substr(dot + 1, at == std::string::npos ? std::string::npos : at - dot - 1));
  if (at != std::string::npos) o.temperature = std::stod(name.substr(at + 1));
  EXPECT_NE(f.meta("temperature"), 1.0) << "a fixture at temperature 1 would not see the division";
  o.loss_agg_mode = parse_loss_agg_mode(name.substr(0, dot));
  expect_case(f, name, o);
}

// POLICY.MODE.KL[.masked]: GSPO against TRL's sequence-level ratio (its own old log-probabilities,
// whose per-response ratios pass both clips), CISPO, Dr. GRPO's sum / (B max_new_tokens), and
// mask_truncated_completions.
class GrpoPolicyLossReference : public ::testing::TestWithParam<std::string> {};

TEST_P(GrpoPolicyLossReference, LossAndEveryGradientMatchPyTorch) {
  if (!have_fixture()) GTEST_SKIP() << "no fixture: run tests/reference/make_grpo_reference.py (make test does)";
  const std::string name = GetParam();
  std::vector<std::string> part = dotted_parts(name);
  const GrpoFixture f(part[0] == "gspo" ? "old_logp_gspo" : "old_logp");
  EXPECT_NE(f.json("policy_cases").dump().find("\"" + name + "\""), std::string::npos) << name << " not in the fixture";
  GrpoLossOptions o = fixture_options(f, part[2]);
  o.policy_loss = parse_policy_loss(part[0]);
  o.loss_agg_mode = parse_loss_agg_mode(part[1]);
  o.max_new_tokens = int64_t(f.meta("max_new_tokens"));
  o.mask_truncated_completions = part.size() > 3;
  expect_case(f, name, o);
}

INSTANTIATE_TEST_SUITE_P(Issue31, GrpoPolicyLossReference,
                         ::testing::Values("gspo.token-mean.none", "gspo.seq-mean-token-mean.k3",
                                           "gspo.seq-mean-token-sum.none", "cispo.token-mean.none",
                                           "cispo.seq-mean-token-sum.k1", "vanilla.seq-mean-token-sum-norm.none",
                                           "vanilla.token-mean.k2.masked", "gspo.seq-mean-token-sum-norm.none.masked"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (char& c : s)
                             if (c == '-' || c == '.') c = '_';
                           return s;
                         });

// rollout_is.LEVEL[.normalize].POLICY.MODE.KL: verl's rollout correction, the weights of the rollout
// engine's log-probabilities against the old ones (token or sequence, truncated at 2, with and
// without batch normalisation) on the policy loss: verl's metrics, the loss and every gradient.
class GrpoRolloutIsReference : public ::testing::TestWithParam<std::string> {};

TEST_P(GrpoRolloutIsReference, WeightsMetricsLossAndEveryGradientMatchPyTorch) {
  if (!have_fixture()) GTEST_SKIP() << "no fixture: run tests/reference/make_grpo_reference.py (make test does)";
  const std::string name = GetParam();
  std::vector<std::string> part = dotted_parts(name);
  const bool normalize = part[2] == "normalize";
  if (normalize) part.erase(part.begin() + 2);
  const bool gspo = part[2] == "gspo";
  GrpoFixture f(gspo ? "old_logp_gspo" : "old_logp", gspo ? "rollout_logp_gspo" : "rollout_logp");
  EXPECT_NE(f.json("rollout_is_cases").dump().find("\"" + name + "\""), std::string::npos) << name;
  const nlohmann::json want = f.json(name);
  double batch[2] = {0, 0};
  const RolloutIsCounts c =
      set_rollout_is_weights(f.rollouts, parse_rollout_is(part[1]), f.meta("rollout_is_threshold"), batch);
  const double mean = want["rollout_is_mean"].get<double>();
  EXPECT_NEAR(c.weight_sum / c.tokens, mean, 1e-9 * mean);
  EXPECT_DOUBLE_EQ(c.above / c.counted, want["rollout_is_ratio_fraction_high"].get<double>());
  EXPECT_DOUBLE_EQ(c.below / c.counted, want["rollout_is_ratio_fraction_low"].get<double>());
  EXPECT_GT(c.above, 0);  // the fixture truncates some weights and not others
  EXPECT_LT(c.above, c.counted);
  if (normalize) {
    const double factor = batch[0] / batch[1];
    EXPECT_NEAR(factor, want["rollout_is_batch_norm_factor"].get<double>(), 1e-12);
    for (RolloutSequence& r : f.rollouts)
      for (double& w : r.is_weight) w /= factor;
  }
  GrpoLossOptions o = fixture_options(f, part[4]);
  o.policy_loss = parse_policy_loss(part[2]);
  o.loss_agg_mode = parse_loss_agg_mode(part[3]);
  expect_case(f, name, o);
}

INSTANTIATE_TEST_SUITE_P(Issue31, GrpoRolloutIsReference,
                         ::testing::Values("rollout_is.token.vanilla.token-mean.k3",
                                           "rollout_is.sequence.vanilla.seq-mean-token-mean.none",
                                           "rollout_is.token.normalize.cispo.token-mean.none",
                                           "rollout_is.sequence.normalize.gspo.seq-mean-token-sum.none"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (char& c : s)
                             if (c == '-' || c == '.') c = '_';
                           return s;
                         });

// GSPO clips whole responses: on its fixture some are clipped (no gradient) and some are not, so
// the case is not one of all-clipped or none-clipped.
TEST(GrpoReference, GspoFixtureClipsSomeResponsesAndNotOthers) {
  if (!have_fixture()) GTEST_SKIP() << "no fixture: run tests/reference/make_grpo_reference.py (make test does)";
  const double clipfrac = GrpoFixture().json("gspo.token-mean.none")["pg_clipfrac"].get<double>();
  EXPECT_GT(clipfrac, 0.2);
  EXPECT_LT(clipfrac, 0.8);
}

INSTANTIATE_TEST_SUITE_P(AggModesAndKl, GrpoReference,
                         ::testing::Values("token-mean.none", "token-mean.k1", "token-mean.k2", "token-mean.k3",
                                           "seq-mean-token-sum.none", "seq-mean-token-sum.k1", "seq-mean-token-sum.k2",
                                           "seq-mean-token-sum.k3", "seq-mean-token-mean.none",
                                           "seq-mean-token-mean.k1", "seq-mean-token-mean.k2",
                                           "seq-mean-token-mean.k3", "token-mean.k3@1"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (char& c : s)
                             if (c == '-' || c == '.' || c == '@') c = '_';
                           return s;
                         });

TEST(GrpoReference, GroupAdvantagesOfGroupsOf1_2_8) {
  if (!have_fixture()) GTEST_SKIP() << "no fixture: run tests/reference/make_grpo_reference.py (make test does)";
  const GrpoFixture f;
  const nlohmann::json a = f.json("advantages");
  const auto r = a["rewards"].get<std::vector<double>>();
  const auto g = a["index"].get<std::vector<int64_t>>();
  for (const bool norm : {true, false}) {
    const std::vector<double> got = group_advantages(r, g, norm);
    const auto want = a[norm ? "norm" : "mean_only"].get<std::vector<double>>();
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-9) << i << " norm " << norm;
  }
  EXPECT_NEAR(group_advantages(r, g, true)[0], r[0] / (1 + 1e-6), 1e-12);  // a group of one: mean 0, std 1, as verl
}

// rloo (verl), TRL's scale_rewards group and batch on groups of 2, 8 and 2 (the group of one is
// left out: TRL's mean of one reward is that reward, verl's is 0).
TEST(GrpoReference, RlooAndTrlScaledAdvantages) {
  if (!have_fixture()) GTEST_SKIP() << "no fixture: run tests/reference/make_grpo_reference.py (make test does)";
  const nlohmann::json a = GrpoFixture().json("advantages");
  const auto r = a["rewards"].get<std::vector<double>>();
  const auto g = a["index"].get<std::vector<int64_t>>();
  const auto want_rloo = a["rloo"].get<std::vector<double>>(), want_group = a["trl_group"].get<std::vector<double>>();
  const auto want_batch = a["trl_batch"].get<std::vector<double>>();
  const std::vector<double> rloo = rloo_advantages(r, g), group = group_advantages(r, g, true, 1e-4);
  const std::vector<double> batch = batch_scaled_advantages(r, g, a["batch_std"].get<double>(), 1e-4);
  for (size_t i = 0; i < r.size(); ++i) {
    EXPECT_NEAR(rloo[i], want_rloo[i], 1e-9) << i;
    if (i == 0) continue;
    EXPECT_NEAR(group[i], want_group[i], 1e-9) << i;
    EXPECT_NEAR(batch[i], want_batch[i], 1e-9) << i;
  }
}

// REINFORCE++: each response's discounted returns whitened over every token of the batch.
TEST(GrpoReference, ReinforcePlusPlusAdvantages) {
  if (!have_fixture()) GTEST_SKIP() << "no fixture: run tests/reference/make_grpo_reference.py (make test does)";
  const GrpoFixture f;
  const auto r = f.json("advantages")["rewards"].get<std::vector<double>>();
  const nlohmann::json want = f.json("reinforce_pp");
  const auto lengths = want["lengths"].get<std::vector<size_t>>();
  for (const auto& [key, gamma] : {std::pair<std::string, double>{"gamma_1", 1.0}, {"gamma_0.9", 0.9}}) {
    std::vector<std::vector<double>> returns;
    for (size_t i = 0; i < r.size(); ++i) returns.push_back(outcome_returns(r[i], lengths[i], gamma));
    masked_whiten(returns);
    const auto w = want[key].get<std::vector<std::vector<double>>>();
    for (size_t i = 0; i < r.size(); ++i)
      for (size_t t = 0; t < lengths[i]; ++t) EXPECT_NEAR(returns[i][t], w[i][t], 1e-9) << key << " " << i << "," << t;
  }
}

TEST(GrpoReference, OverlongPenaltyAsDapo) {
  if (!have_fixture()) GTEST_SKIP() << "no fixture: run tests/reference/make_grpo_reference.py (make test does)";
  const nlohmann::json overlong = GrpoFixture().json("overlong");  // kept alive: items() refers to it
  for (const auto& [length, want] : overlong.items())
    EXPECT_NEAR(overlong_penalty(std::stoll(length), 20, 8, 0.5), want.get<double>(), 1e-12) << length;
  EXPECT_EQ(overlong_penalty(20, 20, 0, 0.5), 0.0);  // buffer 0: off
}

// DAPO's filter: groups of all-0 and all-1 rewards are uniform, a mixed one is not, whatever its
// place in the batch.
TEST(GrpoReference, UniformGroupsAllZeroAllOneMixed) {
  const std::vector<double> rewards = {0, 0, 0, 1, 1, 1, 0, 1, 1, 1, 0, 0, 0.5, 0.5, 0.5};
  const std::vector<int64_t> group = {0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4};
  EXPECT_EQ(uniform_groups(rewards, group, 5), (std::vector<bool>{true, true, false, false, true}));
}

// The log-probabilities of the responses and the entropy of each position's distribution, both of
// softmax(logits / temperature), as PyTorch computes them.
TEST(GrpoReference, ResponseLogpsAndEntropyAtTheRolloutTemperature) {
  if (!have_fixture()) GTEST_SKIP() << "no fixture: run tests/reference/make_grpo_reference.py (make test does)";
  const GrpoFixture f;
  const double temperature = f.meta("temperature");
  auto model = load_model_folder(fixture_dir(), DecoderOptions{});
  double entropy = 0, want_entropy = 0;
  const auto logps = response_logps(*model, f.rows(), 0, temperature, &entropy);
  const Tensor want = f.ref.tensor("policy_logp"), want_h = f.ref.tensor("policy_entropy");
  const int64_t width = want.dim(1);
  const auto at_one = response_logps(*model, f.rows(), 0, 1.0);
  double moved = 0;
  for (size_t i = 0; i < f.rollouts.size(); ++i) {
    const int64_t p = int64_t(f.rollouts[i].prompt.size());
    ASSERT_EQ(logps[i].size(), f.rollouts[i].response.size());
    for (size_t k = 0; k < logps[i].size(); ++k) {
      const int64_t at = int64_t(i) * width + p - 1 + int64_t(k);
      EXPECT_NEAR(logps[i][k], want.data<float>()[at], 1e-5) << i << "," << k;
      want_entropy += want_h.data<float>()[at];
      moved = std::max(moved, std::fabs(at_one[i][k] - logps[i][k]));
    }
  }
  EXPECT_NEAR(entropy, want_entropy, 1e-4);
  EXPECT_GT(moved, 0.05) << "temperature " << temperature << " gives the log-probabilities of temperature 1";
}

// The policy is its own rollout policy: the ratio is 1 everywhere, so the token-mean loss is minus
// the mean advantage over tokens and nothing is clipped (the old log-probabilities and the
// policy's at the same temperature).
TEST(GrpoReference, RatioOneLossIsMinusMeanAdvantage) {
  if (!have_fixture()) GTEST_SKIP() << "no fixture: run tests/reference/make_grpo_reference.py (make test does)";
  GrpoFixture f;
  auto model = load_model_folder(fixture_dir(), DecoderOptions{});
  GrpoLossOptions o;
  o.temperature = f.meta("temperature");
  const auto logps = response_logps(*model, f.rows(), 0, o.temperature);
  double want = 0, tokens = 0;
  for (size_t i = 0; i < f.rollouts.size(); ++i) {
    f.rollouts[i].old_logp = logps[i];
    want -= f.rollouts[i].advantage * double(logps[i].size());
    tokens += double(logps[i].size());
  }
  const GrpoLossResult r = grpo_minibatch(*model, f.rows(), o, 0, 1.0f, false);
  EXPECT_NEAR(r.loss, want / tokens, 1e-6);
  EXPECT_EQ(r.pg_clipfrac, 0.0);
  EXPECT_NEAR(r.ppo_kl, 0.0, 1e-6);
}

// The stage takes the log-probabilities at the rollout temperature; greedy rollouts (temperature
// 0, ppo's) at 1.
TEST(GrpoReference, LossOptionsTakeTheRolloutTemperature) {
  TrainConfig c;
  c.temperature = 0.6;
  EXPECT_EQ(grpo_loss_options(c).temperature, 0.6);
  c.temperature = 0;
  EXPECT_EQ(grpo_loss_options(c).temperature, 1.0);
}

}  // namespace
}  // namespace fab
