// stage grpo's objective against tests/reference/make_grpo_reference.py (PyTorch autograd over
// verl's formulas): on a fixed batch of rollouts of the reference's tiny Llama, the loss and every
// parameter gradient within 1e-5 for each loss_agg_mode and KL type, the log-probabilities of
// softmax(logits / temperature) at a rollout temperature of 0.7 (and one case at 1), as verl's
// actor and TRL's GRPOTrainer take them; the per-token log-probabilities and entropies at 0.7; the
// group advantages of groups of 1, 2 and 8 as verl computes them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "io/safetensors.h"
#include "models/hf_model.h"
#include "train/stages/rollout_stage.h"
#include "test_util.h"

namespace fab {
namespace {

std::string fixture_dir() { return test::reference_dir() + "/grpo"; }

bool have_fixture() { return std::filesystem::exists(fixture_dir() + "/reference.safetensors"); }

struct GrpoFixture {
  SafetensorsFile ref = SafetensorsFile::open(fixture_dir() + "/reference.safetensors");
  std::vector<RolloutSequence> rollouts;

  GrpoFixture() {
    const Tensor ids = ref.tensor("ids"), old = ref.tensor("old_logp"), reference = ref.tensor("ref_logp");
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
      }
      r.advantage = adv.data<float>()[i];
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

TEST_P(GrpoReference, LossAndEveryGradientMatchPyTorch) {
  if (!have_fixture()) GTEST_SKIP() << "no fixture: run tests/reference/make_grpo_reference.py (make test does)";
  const GrpoFixture f;
  const std::string name = GetParam();
  const size_t dot = name.find('.'), at = name.find('@');
  GrpoLossOptions o;
  o.temperature = at == std::string::npos ? f.meta("temperature") : std::stod(name.substr(at + 1));
  EXPECT_NE(f.meta("temperature"), 1.0) << "a fixture at temperature 1 would not see the division";
  o.clip_ratio_low = f.meta("clip_ratio_low");
  o.clip_ratio_high = f.meta("clip_ratio_high");
  o.clip_ratio_c = f.meta("clip_ratio_c");
  o.loss_agg_mode = parse_loss_agg_mode(name.substr(0, dot));
  const std::string kl = name.substr(dot + 1, at == std::string::npos ? std::string::npos : at - dot - 1);
  o.kl_loss_coef = kl == "none" ? 0.0 : f.meta("kl_loss_coef");
  if (kl != "none") o.kl_loss_type = parse_kl_type(kl);
  auto model = load_model_folder(fixture_dir(), DecoderOptions{});
  model->params().grads().zero_();
  const GrpoLossResult r = grpo_minibatch(*model, f.rows(), o, 0, 1.0f, true);
  const nlohmann::json want = f.json(name);
  EXPECT_NEAR(r.loss, want["loss"].get<double>(), 1e-5 * std::max(1.0, std::fabs(want["loss"].get<double>()))) << name;
  EXPECT_NEAR(r.pg_clipfrac, want["pg_clipfrac"].get<double>(), 1e-12) << name;
  EXPECT_NEAR(r.pg_clipfrac_lower, want["pg_clipfrac_lower"].get<double>(), 1e-12) << name;
  for (const ParamInfo& p : model->params().params())
    test::expect_close(model->params().grads().view(p.offset, p.shape), f.ref.tensor(name + ".grad." + p.name), 1e-5,
                       name + " grad " + p.name);
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
