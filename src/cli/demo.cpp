// `fabrica demo`: the whole product on built-in data, in a couple of minutes on 2 cores. It makes
// a synthetic task (two-digit addition, as alpaca-format JSON), trains a byte-level BPE tokenizer
// on it, sets up a tiny Qwen3-architecture model from scratch, measures held-out accuracy, trains
// it with the same code path as `fabrica train` (data preparation, chatml template, Trainer), and
// measures accuracy again, printing a few generations.
#include "cli/demo.h"
#include "cli/demo_task.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/rng.h"
#include "dataset/prepare.h"
#include "io/checkpoint_names.h"
#include "parallel/parallelize.h"
#include "train/stages/rollout_stage.h"
#include "train/trainer.h"

namespace fab {
namespace fs = std::filesystem;

namespace {

// Distinct a+b problems (0 <= a, b < 100) written at fixed width ("07+43=" -> "050"), so every
// digit has a fixed place, split into train and held-out sets.
std::pair<std::vector<Problem>, std::vector<Problem>> make_problems(size_t train, size_t test) {
  Rng rng(2026);
  std::set<std::pair<int, int>> seen;
  std::vector<Problem> all;
  while (all.size() < train + test) {
    const int a = int(rng.next_u64() % 100), b = int(rng.next_u64() % 100);
    if (!seen.insert({a, b}).second) continue;
    char question[16], answer[8];
    std::snprintf(question, sizeof question, "%02d+%02d=", a, b);
    std::snprintf(answer, sizeof answer, "%03d", a + b);
    all.push_back({question, answer});
  }
  return {{all.begin(), all.begin() + long(train)}, {all.begin() + long(train), all.end()}};
}

// stage ppo on the same task: one sample per prompt at temperature 1, as many samples per step
// as grpo's; a critic from the same start with a zero value head, learning 10x faster than the actor.
std::string ppo_yaml(const std::string& work, const std::string& start, int steps) {
  return demo_common_yaml(start, work + "/data/rl.json", work + "/rl", work + "/cache", steps) +
         "stage: ppo\nreward: exact_match\nper_device_train_batch_size: 64\nnum_generations: 1\n"
         "temperature: 1.0\ntop_p: 1.0\ntop_k: 0\nmax_new_tokens: 6\nppo_epochs: 1\nppo_mini_batch_size: 32\n"
         "gamma: 1.0\nlam: 1.0\ncritic_learning_rate: 1.0e-3\nlearning_rate: 1.0e-4\nlr_scheduler_type: constant\n";
}

}  // namespace

// The model is learning carries fast around there: its accuracy climbs from under 10% to over 90%
// within a few dozen steps, so the partly trained start is picked by accuracy, not by step.
constexpr int kCheckpointEvery = 10;
constexpr double kPartialAccuracy = 0.3;

// Part-way SFT, then GRPO with the exact-match reward on problems SFT did not see.
int run_demo_rl(int sft_steps, int rl_steps, const std::string& work, const std::string& stage_text) {
  const std::optional<Stage> parsed = parse_stage(stage_text);
  FAB_USER_CHECK(parsed && is_rollout(*parsed), "demo --rl --stage: expected grpo or ppo, got \"{}\"", stage_text);
  const Stage stage = *parsed;
  const std::string name = stage == Stage::ppo ? "PPO" : "GRPO";
  const auto start = std::chrono::steady_clock::now();
  fs::remove_all(work);
  fs::create_directories(work + "/data");
  fs::create_directories(work + "/model");
  auto [train, test] = make_problems(6000, 200);
  const std::vector<Problem> sft(train.begin(), train.begin() + 4000), rl(train.begin() + 4000, train.end());
  write_alpaca(work + "/data/train.json", sft);
  write_alpaca(work + "/data/rl.json", rl);
  std::printf("1. task: two-digit addition; %zu problems for SFT, %zu other ones for %s (only their answers, "
              "through the reward), %zu held out (%s/data)\n",
              sft.size(), rl.size(), name.c_str(), test.size(), work.c_str());
  const Tokenizer tokenizer = make_tiny_model_folder(work + "/model", sft, 400);

  std::printf("2. SFT part of the way: %d steps, a checkpoint every %d; the first checkpoint from step %d on "
              "with at least %.0f%% held-out accuracy is %s's start\n",
              sft_steps, kCheckpointEvery, sft_steps * 4 / 9 / kCheckpointEvery * kCheckpointEvery, 100 * kPartialAccuracy,
              name.c_str());
  TrainConfig sft_config = parse_train_config(
      demo_sft_yaml(work + "/model", work + "/data/train.json", work + "/out", work + "/cache", sft_steps), "demo-sft.yaml");
  sft_config.save_steps = kCheckpointEvery;
  PreparedData sft_data = prepare_data(sft_config, tokenizer);
  Trainer(sft_config, parallelize(load_tiny_model(work + "/model"), nullptr, sft_config),
          TrainData{sft_data.train, sft_data.eval, *tokenizer.pad_id()})
      .run();
  std::string start_dir = work + "/out";
  std::unique_ptr<DecoderModel> partial;
  double before = 0;
  for (int step = sft_steps * 4 / 9 / kCheckpointEvery * kCheckpointEvery; step <= sft_steps; step += kCheckpointEvery) {
    start_dir = step < sft_steps ? work + "/out/" + checkpoint_name(step) : work + "/out";
    if (!fs::exists(start_dir + "/model.safetensors")) continue;
    partial = load_tiny_model(start_dir);
    before = greedy_accuracy(*partial, tokenizer, test);
    std::printf("   %s: held-out accuracy %.1f%%\n", start_dir.c_str(), 100 * before);
    if (before >= kPartialAccuracy) break;
  }

  std::printf("3. %s %d steps, reward exact_match, %s per step (config in %s/rl/train_config.yaml):\n", name.c_str(),
              rl_steps, stage == Stage::ppo ? "64 prompts x 1 sample, a critic" : "8 prompts x 8 samples", work.c_str());
  const TrainConfig rl_config =
      parse_train_config(stage == Stage::ppo ? ppo_yaml(work, start_dir, rl_steps)
                                             : demo_grpo_yaml(start_dir, work + "/data/rl.json", work + "/rl",
                                                              work + "/cache", rl_steps,
                                                              "ppo_epochs: 1\nppo_mini_batch_size: 4\n"),
                         "demo-" + stage_text + ".yaml");
  PreparedData rl_data = prepare_data(rl_config, tokenizer);
  TrainData rl_train{rl_data.train, rl_data.eval, *tokenizer.pad_id()};
  rl_train.rollout = rollout_environment(rl_config, tokenizer);
  Trainer(rl_config, parallelize(std::move(partial), nullptr, rl_config), std::move(rl_train)).run();

  std::ifstream metrics(work + "/rl/metrics.jsonl");
  std::string line, first;
  for (std::string l; std::getline(metrics, l);) (first.empty() ? first : line) = l;
  if (!first.empty() && !line.empty())
    std::printf("   reward_mean (exact match of the samples at temperature 1): %.3f at step %lld, %.3f at step %lld\n",
                nlohmann::json::parse(first)["reward_mean"].get<double>(),
                (long long)nlohmann::json::parse(first)["step"].get<int64_t>(),
                nlohmann::json::parse(line)["reward_mean"].get<double>(),
                (long long)nlohmann::json::parse(line)["step"].get<int64_t>());
  auto after_rl = load_tiny_model(work + "/rl");
  std::printf("4. after %s, a few held-out problems:\n", name.c_str());
  const double after = greedy_accuracy(*after_rl, tokenizer, test, 6);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("   held-out accuracy: %.1f%% after SFT, %.1f%% after %s  (%.0f s in all; the model is in %s/rl)\n",
              100 * before, 100 * after, name.c_str(), seconds, work.c_str());
  return 0;
}

int run_demo(int steps, const std::string& work) {
  const auto start = std::chrono::steady_clock::now();
  fs::remove_all(work);
  fs::create_directories(work + "/data");
  fs::create_directories(work + "/model");
  auto [train, test] = make_problems(4000, 200);
  write_alpaca(work + "/data/train.json", train);
  std::printf("1. task: two-digit addition, %zu training and %zu held-out problems (%s/data)\n", train.size(),
              test.size(), work.c_str());

  const Tokenizer tokenizer = make_tiny_model_folder(work + "/model", train, 400);
  std::printf("2. tokenizer: byte-level BPE, %lld tokens (%s/model/tokenizer.json)\n",
              (long long)tokenizer.vocab_size(), work.c_str());

  auto untrained = load_tiny_model(work + "/model");
  std::printf("3. model: Qwen3 architecture from scratch, %lld parameters; held-out accuracy before training: "
              "%.1f%%\n",
              (long long)untrained->config().num_parameters(), 100 * greedy_accuracy(*untrained, tokenizer, test));

  std::printf("4. training %d steps (the `fabrica train` path; config in %s/out/train_config.yaml):\n", steps,
              work.c_str());
  const TrainConfig config = parse_train_config(
      demo_sft_yaml(work + "/model", work + "/data/train.json", work + "/out", work + "/cache", steps), "demo.yaml");
  PreparedData data = prepare_data(config, tokenizer);
  Trainer trainer(config, parallelize(std::move(untrained), nullptr, config), TrainData{data.train, data.eval, *tokenizer.pad_id()});
  trainer.run();

  auto trained = load_tiny_model(work + "/out");
  std::printf("5. after training, a few held-out problems:\n");
  const double after = greedy_accuracy(*trained, tokenizer, test, 6);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("   held-out accuracy after training: %.1f%%  (%.0f s in all; the model is in %s/out)\n", 100 * after,
              seconds, work.c_str());
  return 0;
}

}  // namespace fab
