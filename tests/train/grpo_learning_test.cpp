// GRPO learns what SFT could not, on held-out questions, with stage grpo's default update settings
// (one on-policy update per rollout batch). Each task's SFT demonstrations follow a wrong rule 65% of
// the time and the right rule 35%, so after SFT the greedy answer follows the wrong rule while about
// one sample in three is right; only the exact-match reward can tell the rules apart. GRPO runs on
// questions SFT never saw and is judged by greedy accuracy on a third set. Neither task is the
// demo's (two-digit addition). A sign error in the advantages, a ratio or clip that moves the wrong
// way, or updates that drift off-policy keep the greedy answer on the wrong rule and fail this test.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <set>

#include <nlohmann/json.hpp>

#include "cli/demo_task.h"
#include "config/train_config.h"
#include "core/rng.h"
#include "dataset/prepare.h"
#include "parallel/parallelize.h"
#include "test_util.h"
#include "train/stages/rollout_stage.h"
#include "train/trainer.h"

namespace fab {
namespace {

struct Task {
  std::string name;
  std::function<std::string(Rng&)> question;
  std::function<std::string(const std::string&)> right, wrong;
};

std::string four_digits(Rng& rng) {
  std::string q;
  for (int i = 0; i < 4; ++i) q += char('0' + rng.next_u64() % 10);
  return q;
}

// Four digits; the right answer rotates them left ("1234" -> "2341"), the wrong rule right ("4123").
Task rotate_task() {
  return {"rotate", four_digits, [](const std::string& q) { return q.substr(1) + q[0]; },
          [](const std::string& q) { return q.back() + q.substr(0, 3); }};
}

// Four digits; the right answer adds 1 to each (mod 10), the wrong rule subtracts 1.
Task successor_task() {
  const auto shift = [](const std::string& q, int by) {
    std::string a = q;
    for (char& c : a) c = char('0' + (c - '0' + 10 + by) % 10);
    return a;
  };
  return {"successor", four_digits, [shift](const std::string& q) { return shift(q, 1); }, [shift](const std::string& q) { return shift(q, -1); }};
}

struct Sets {
  std::vector<Problem> sft, rl, held_out, held_out_wrong;
};

Sets make_sets(const Task& task) {
  Rng rng(2027);
  std::set<std::string> seen;
  std::vector<std::string> questions;
  while (questions.size() < 2000 + 600 + 200) {
    std::string q = task.question(rng);
    if (seen.insert(q).second) questions.push_back(q);
  }
  Sets s;
  for (size_t i = 0; i < questions.size(); ++i) {
    const std::string& q = questions[i];
    if (i < 2000) {
      s.sft.push_back({q, rng.next_u64() % 100 < 45 ? task.right(q) : task.wrong(q)});
    } else if (i < 2600) {
      s.rl.push_back({q, task.right(q)});
    } else {
      s.held_out.push_back({q, task.right(q)});
      s.held_out_wrong.push_back({q, task.wrong(q)});
    }
  }
  return s;
}

void train(const std::string& yaml, const std::string& name, const Tokenizer& tokenizer,
           std::unique_ptr<DecoderModel> model) {
  const TrainConfig config = parse_train_config(yaml, name);
  PreparedData data = prepare_data(config, tokenizer);
  TrainData train_data{data.train, data.eval, *tokenizer.pad_id()};
  if (is_rollout(config.stage)) train_data.rollout = rollout_environment(config, tokenizer);
  Trainer(config, parallelize(std::move(model), nullptr, config), std::move(train_data)).run();
}

// "step:reward_mean" of each logged step of the run in `dir`.
std::string reward_curve(const std::string& dir) {
  std::ifstream metrics(dir + "/metrics.jsonl");
  std::string curve;
  for (std::string line; std::getline(metrics, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.contains("reward_mean"))
      curve += std::to_string(j["step"].get<int64_t>()) + ":" + std::to_string(j["reward_mean"].get<double>()).substr(0, 5) + " ";
  }
  return curve;
}

void expect_grpo_learns(const Task& task) {
  const std::string work = test::fresh_dir("grpo_learning_" + task.name);
  const Sets sets = make_sets(task);
  write_alpaca(work + "/sft.json", sets.sft);
  write_alpaca(work + "/rl.json", sets.rl);
  std::filesystem::create_directories(work + "/model");
  const Tokenizer tokenizer = make_tiny_model_folder(work + "/model", sets.sft, 300);

  train(demo_sft_yaml(work + "/model", work + "/sft.json", work + "/sft", work + "/cache", 200), "sft.yaml", tokenizer,
        load_tiny_model(work + "/model"));
  auto sft = load_tiny_model(work + "/sft");
  const double wrong_before = greedy_accuracy(*sft, tokenizer, sets.held_out_wrong);
  const double before = greedy_accuracy(*sft, tokenizer, sets.held_out);
  // The setup itself: SFT learned both rules and prefers the wrong one.
  EXPECT_GE(wrong_before, 0.4) << task.name;
  EXPECT_LE(before, 0.2) << task.name;

  train(demo_grpo_yaml(work + "/sft", work + "/rl.json", work + "/grpo", work + "/cache", 40), "grpo.yaml", tokenizer,
        std::move(sft));
  auto grpo = load_tiny_model(work + "/grpo");
  const double after = greedy_accuracy(*grpo, tokenizer, sets.held_out, 4);
  std::printf("%s: held-out greedy accuracy %.1f%% after SFT (%.1f%% on the wrong rule), %.1f%% after GRPO; "
              "reward_mean by step: %s\n",
              task.name.c_str(), 100 * before, 100 * wrong_before, 100 * after, reward_curve(work + "/grpo").c_str());
  EXPECT_GE(after, 0.7) << task.name << ": before GRPO " << before;
}

TEST(GrpoLearning, RotateDigitsHeldOutGreedyAccuracyRises) { expect_grpo_learns(rotate_task()); }
TEST(GrpoLearning, DigitSuccessorHeldOutGreedyAccuracyRises) { expect_grpo_learns(successor_task()); }

}  // namespace
}  // namespace fab
