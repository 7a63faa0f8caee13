// stage ppo's critic side against tests/reference/make_ppo_reference.py (PyTorch over verl's
// formulas): on a fixed batch of the reference's tiny Llama critic, the whitened GAE advantages
// and returns for several (gamma, lam) with and without the KL penalty in the reward; the value
// loss, vf_clipfrac, vpred_mean and every critic parameter gradient within 1e-5 for each
// loss_agg_mode, with the value clip hit on both sides. The actor at a rollout temperature of 0.7:
// its per-token log-probabilities and entropies of softmax(logits / 0.7), and the clipped surrogate
// with the GAE advantages with every policy gradient. And GAE's edge cases by hand.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "comm/communicator.h"
#include "config/train_config.h"
#include "io/safetensors.h"
#include "models/hf_model.h"
#include "train/stages/ppo_stage.h"
#include "test_util.h"

namespace fab {
namespace {

std::string fixture_dir() { return test::reference_dir() + "/ppo"; }

bool have_fixture() { return std::filesystem::exists(fixture_dir() + "/reference.safetensors"); }

struct PpoFixture {
  SafetensorsFile ref = SafetensorsFile::open(fixture_dir() + "/reference.safetensors");
  std::vector<RolloutSequence> rollouts;

  PpoFixture() {
    const Tensor ids = ref.tensor("ids"), prompts = ref.tensor("prompt_lengths");
    const Tensor responses = ref.tensor("response_lengths"), scores = ref.tensor("scores");
    const Tensor old = ref.tensor("old_logp"), reference = ref.tensor("ref_logp");
    const Tensor values = ref.tensor("values"), returns = ref.tensor("returns");
    const int64_t t = ids.dim(1), width = values.dim(1);
    for (int64_t i = 0; i < ids.dim(0); ++i) {
      RolloutSequence r;
      const int64_t p = prompts.data<int64_t>()[i], n = responses.data<int64_t>()[i];
      for (int64_t k = 0; k < p + n; ++k) (k < p ? r.prompt : r.response).push_back(int32_t(ids.data<int64_t>()[i * t + k]));
      for (int64_t k = 0; k < n; ++k) {
        r.old_logp.push_back(old.data<float>()[i * width + k]);
        r.ref_logp.push_back(reference.data<float>()[i * width + k]);
        r.values.push_back(values.data<float>()[i * width + k]);
        r.returns.push_back(returns.data<float>()[i * width + k]);
      }
      r.reward = scores.data<float>()[i];
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

TEST(PpoReference, GaeAdvantagesAndReturnsMatchVerl) {
  if (!have_fixture()) GTEST_SKIP() << "no fixture: run tests/reference/make_ppo_reference.py (make test does)";
  PpoFixture f;
  LocalCommunicator one;
  for (const std::string name : f.json("gae_cases").get<std::vector<std::string>>()) {
    const nlohmann::json want = f.json(name);
    TrainConfig c;
    c.gamma = want["gamma"].get<double>();
    c.lam = want["lam"].get<double>();
    const std::string kl = want["kl_penalty"].get<std::string>();
    c.use_kl_in_reward = kl != "none";
    if (c.use_kl_in_reward) c.kl_penalty = kl;
    c.kl_coef = f.meta("kl_coef");
    double kl_sum = 0;
    set_advantages(f.rollouts, c, one, &kl_sum);
    EXPECT_NEAR(kl_sum / double(f.rollouts.size()), want["reward_kl_penalty"].get<double>(), 1e-9) << name;
    const auto adv = want["advantages"].get<std::vector<std::vector<double>>>();
    const auto ret = want["returns"].get<std::vector<std::vector<double>>>();
    for (size_t i = 0; i < f.rollouts.size(); ++i) {
      ASSERT_EQ(f.rollouts[i].token_advantages.size(), adv[i].size()) << name;
      for (size_t k = 0; k < adv[i].size(); ++k) {
        EXPECT_NEAR(f.rollouts[i].token_advantages[k], adv[i][k], 1e-9) << name << " advantage " << i << "," << k;
        EXPECT_NEAR(f.rollouts[i].returns[k], ret[i][k], 1e-9) << name << " return " << i << "," << k;
      }
    }
  }
}

class PpoValueReference : public ::testing::TestWithParam<std::string> {};

TEST_P(PpoValueReference, ValueLossAndEveryCriticGradientMatchPyTorch) {
  if (!have_fixture()) GTEST_SKIP() << "no fixture: run tests/reference/make_ppo_reference.py (make test does)";
  const PpoFixture f;
  const std::string name = "value." + GetParam();
  ValueLossOptions o{f.meta("cliprange_value"), parse_loss_agg_mode(GetParam())};
  DecoderOptions options;
  options.value_head = true;
  auto critic = load_model_folder(fixture_dir(), options);
  critic->params().grads().zero_();
  const ValueLossResult r = value_minibatch(*critic, f.rows(), o, 0, 1.0f, true);
  const nlohmann::json want = f.json(name);
  EXPECT_NEAR(r.vf_loss, want["vf_loss"].get<double>(), 1e-5 * std::max(1.0, std::fabs(want["vf_loss"].get<double>())));
  EXPECT_NEAR(r.vf_clipfrac, want["vf_clipfrac"].get<double>(), 1e-12);
  EXPECT_NEAR(r.vpred_mean, want["vpred_mean"].get<double>(), 1e-5);
  for (const ParamInfo& p : critic->params().params())
    test::expect_close(critic->params().grads().view(p.offset, p.shape), f.ref.tensor(name + ".grad." + p.name), 1e-5,
                       name + " grad " + p.name);
}

INSTANTIATE_TEST_SUITE_P(AggModes, PpoValueReference,
                         ::testing::Values("token-mean", "seq-mean-token-sum", "seq-mean-token-mean"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (char& c : s)
                             if (c == '-') c = '_';
                           return s;
                         });

// The critic's values before any update are its predictions now: nothing is clipped, and with
// returns equal to the values the loss and its gradient are zero.
TEST(PpoReference, ValuesOfTheCriticItselfAreUnclipped) {
  if (!have_fixture()) GTEST_SKIP() << "no fixture: run tests/reference/make_ppo_reference.py (make test does)";
  PpoFixture f;
  DecoderOptions options;
  options.value_head = true;
  auto critic = load_model_folder(fixture_dir(), options);
  const auto values = response_values(*critic, f.rows(), 0);
  for (size_t i = 0; i < f.rollouts.size(); ++i) f.rollouts[i].values = f.rollouts[i].returns = values[i];
  const ValueLossResult r = value_minibatch(*critic, f.rows(), ValueLossOptions{}, 0, 1.0f, false);
  EXPECT_NEAR(r.vf_loss, 0.0, 1e-12);
  EXPECT_EQ(r.vf_clipfrac, 0.0);
}

// The actor's log-probabilities (old, reference and current alike: response_logps and
// grpo_minibatch) at the rollout temperature, and its loss and gradients with per-token advantages.
TEST(PpoReference, ActorAtTheRolloutTemperatureMatchesPyTorch) {
  if (!have_fixture()) GTEST_SKIP() << "no fixture: run tests/reference/make_ppo_reference.py (make test does)";
  PpoFixture f;
  const nlohmann::json want = f.json("actor");
  const Tensor logp = f.ref.tensor("actor_logp"), entropy = f.ref.tensor("actor_entropy");
  const Tensor old = f.ref.tensor("actor_old_logp"), adv = f.ref.tensor("actor_advantages");
  const int64_t width = logp.dim(1);
  GrpoLossOptions o;
  o.temperature = want["temperature"].get<double>();
  ASSERT_NE(o.temperature, 1.0);
  o.clip_ratio_low = o.clip_ratio_high = want["clip_ratio"].get<double>();
  auto actor = load_model_folder(fixture_dir(), DecoderOptions{});
  double entropy_sum = 0, want_entropy = 0;
  const auto logps = response_logps(*actor, f.rows(), 0, o.temperature, &entropy_sum);
  for (size_t i = 0; i < f.rollouts.size(); ++i) {
    RolloutSequence& r = f.rollouts[i];
    ASSERT_EQ(logps[i].size(), r.response.size());
    r.old_logp.clear();
    r.token_advantages.clear();
    for (size_t k = 0; k < r.response.size(); ++k) {
      const int64_t at = int64_t(i) * width + int64_t(k);
      EXPECT_NEAR(logps[i][k], logp.data<float>()[at], 1e-5) << i << "," << k;
      want_entropy += entropy.data<float>()[at];
      r.old_logp.push_back(old.data<float>()[at]);
      r.token_advantages.push_back(adv.data<float>()[at]);
    }
  }
  EXPECT_NEAR(entropy_sum, want_entropy, 1e-4);
  actor->params().grads().zero_();
  const GrpoLossResult r = grpo_minibatch(*actor, f.rows(), o, 0, 1.0f, true);
  EXPECT_NEAR(r.pg_loss, want["pg_loss"].get<double>(), 1e-5 * std::max(1.0, std::fabs(want["pg_loss"].get<double>())));
  EXPECT_NEAR(r.pg_clipfrac, want["pg_clipfrac"].get<double>(), 1e-12);
  for (const ParamInfo& p : actor->params().params())
    test::expect_close(actor->params().grads().view(p.offset, p.shape), f.ref.tensor("actor.grad." + p.name), 1e-5,
                       "actor grad " + p.name);
}

TEST(PpoGae, ResponseOfOneToken) {
  // delta = r - V, A = delta, R = r whatever gamma and lam
  for (const double gamma : {1.0, 0.5})
    for (const double lam : {1.0, 0.0}) {
      const Gae g = gae({2.0}, {0.5}, gamma, lam);
      EXPECT_DOUBLE_EQ(g.advantages[0], 1.5);
      EXPECT_DOUBLE_EQ(g.returns[0], 2.0);
    }
}

TEST(PpoGae, GammaAndLambdaOneGiveRewardToGoMinusValue) {
  const std::vector<double> r = {0.1, -0.2, 0.0, 1.0}, v = {0.3, 0.7, -0.4, 0.2};
  const Gae g = gae(r, v, 1.0, 1.0);
  double to_go = 0;
  for (size_t k = r.size(); k-- > 0;) {
    to_go += r[k];
    EXPECT_NEAR(g.advantages[k], to_go - v[k], 1e-12);
    EXPECT_NEAR(g.returns[k], to_go, 1e-12);
  }
  // lam 0: one-step TD errors, r_t + gamma V_{t+1} - V_t
  const Gae td = gae(r, v, 0.9, 0.0);
  for (size_t k = 0; k < r.size(); ++k)
    EXPECT_NEAR(td.advantages[k], r[k] + 0.9 * (k + 1 < r.size() ? v[k + 1] : 0.0) - v[k], 1e-12);
}

// A response's GAE sees its own tokens only: padding after a shorter response (verl's masks)
// changes nothing, and the batch couples the responses only through the whitening.
TEST(PpoGae, PaddingAndOtherResponsesTakeNoPart) {
  const Gae alone = gae({0.0, 1.0}, {0.2, 0.4}, 0.95, 0.9);
  std::vector<RolloutSequence> batch(2);
  batch[0].response = {5, 6};
  batch[0].reward = 1.0;
  batch[0].values = {0.2, 0.4};
  batch[1].response = {7, 8, 9, 10, 11};
  batch[1].reward = -1.0;
  batch[1].values = {0.1, 0.0, 0.3, 0.2, 0.5};
  TrainConfig c;
  c.gamma = 0.95;
  c.lam = 0.9;
  LocalCommunicator one;
  set_advantages(batch, c, one);
  EXPECT_NEAR(batch[0].returns[0], alone.returns[0], 1e-12);
  EXPECT_NEAR(batch[0].returns[1], alone.returns[1], 1e-12);
  double sum = 0, squares = 0, n = 0;
  for (const RolloutSequence& r : batch)
    for (double a : r.token_advantages) sum += a, squares += a * a, n += 1;
  EXPECT_NEAR(sum / n, 0.0, 1e-12);                        // whitened: mean 0
  EXPECT_NEAR(squares / (n - 1), 1.0, 1e-6);               // unbiased variance 1 (up to the 1e-8)
}

// One token in the whole batch: verl raises; its whitened advantage is 0 here.
TEST(PpoGae, WhiteningOneTokenGivesZero) {
  std::vector<std::vector<double>> a = {{3.0}};
  masked_whiten(a);
  EXPECT_EQ(a[0][0], 0.0);
}

TEST(PpoGae, KlPenaltyInTheReward) {
  // k1 on each token, the score on the last: r = (0, 0, 1) - 0.1 * (old - ref)
  const std::vector<double> r = token_rewards(1.0, 3, {-1.0, -2.0, -0.5}, {-1.5, -1.0, -0.5}, 0.1, KlType::k1);
  EXPECT_NEAR(r[0], -0.05, 1e-12);
  EXPECT_NEAR(r[1], 0.1, 1e-12);
  EXPECT_NEAR(r[2], 1.0, 1e-12);
  EXPECT_EQ(token_rewards(2.0, 2, {}, {}, 0.1, KlType::k1), (std::vector<double>{0.0, 2.0}));
}

}  // namespace
}  // namespace fab
