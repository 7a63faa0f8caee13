// The trainer: exact resume, gradient accumulation equal to one big batch, checkpoints that are
// atomic and pruned, NaN stops with the step, the final HF folder loads back.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "models/hf_model.h"
#include "train/checkpoint.h"
#include "train/synthetic_data.h"
#include "train/trainer.h"

namespace fab {
namespace {
namespace fs = std::filesystem;

std::string fresh_dir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/trainer-" + name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// A config-only model folder: trained from scratch with the run's seed.
std::string tiny_model_folder() {
  const std::string dir = fresh_dir("model");
  std::ofstream(dir + "/config.json") << R"({"model_type":"llama","vocab_size":64,"hidden_size":32,
    "intermediate_size":48,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,
    "max_position_embeddings":64})";
  return dir;
}

TrainConfig config_for(const std::string& output, const std::string& extra = "") {
  return parse_train_config("model_name_or_path: " + tiny_model_folder() + "\nstage: sft\noutput_dir: " + output +
                                "\nmax_steps: 8\nper_device_train_batch_size: 2\ngradient_accumulation_steps: 2\n"
                                "learning_rate: 1.0e-2\nlr_scheduler_type: cosine\nwarmup_steps: 2\nlogging_steps: 1\n"
                                "weight_decay: 0.1\nsave_steps: 3\nseed: 5\n" + extra,
                            "test.yaml");
}

std::unique_ptr<Trainer> make_trainer(const TrainConfig& c) {
  auto model = load_model_folder(c.model_name_or_path, {c.bf16 ? Precision::bf16 : Precision::fp32, false, 64},
                                 uint64_t(c.seed));
  TrainData data{test::synthetic_samples(20, 1), test::synthetic_samples(5, 2), 0};
  return std::make_unique<Trainer>(c, std::move(model), std::move(data));
}

TEST(Trainer, ResumeReproducesTheUninterruptedRunBitForBit) {
  const std::string a = fresh_dir("full"), b = fresh_dir("resumed");
  auto full = make_trainer(config_for(a));
  ASSERT_TRUE(full->run());
  ASSERT_TRUE(fs::exists(a + "/checkpoint-6"));
  // The "interrupted" run: only what the full run had written by step 3 (checkpoint-3).
  fs::copy(a + "/checkpoint-3", b + "/checkpoint-3", fs::copy_options::recursive);
  auto resumed = make_trainer(config_for(b, "resume_from_checkpoint: true\n"));
  ASSERT_TRUE(resumed->run());
  ASSERT_EQ(resumed->history().size(), 5u);  // steps 4..8
  for (const StepRecord& r : resumed->history()) {
    const StepRecord& ref = full->history()[size_t(r.step - 1)];
    EXPECT_EQ(r.loss, ref.loss) << "step " << r.step;
    EXPECT_EQ(r.grad_norm, ref.grad_norm) << "step " << r.step;
    EXPECT_EQ(r.lr, ref.lr) << "step " << r.step;
  }
  auto wa = load_model_folder(a, {}), wb = load_model_folder(b, {});
  EXPECT_EQ(0, std::memcmp(wa->params().values().raw(), wb->params().values().raw(), wa->params().values().bytes()));
}

TEST(Trainer, GradientAccumulationEqualsOneBigBatch) {
  auto accumulated = make_trainer(config_for(fresh_dir("ga2"), "shuffle: false\nsave_steps: 0\n"));
  auto big = make_trainer(config_for(fresh_dir("ga1"),
                                     "shuffle: false\nsave_steps: 0\nper_device_train_batch_size: 4\n"
                                     "gradient_accumulation_steps: 1\n"));
  accumulated->run();
  big->run();
  ASSERT_EQ(accumulated->history().size(), big->history().size());
  for (size_t i = 0; i < big->history().size(); ++i)
    EXPECT_NEAR(accumulated->history()[i].loss, big->history()[i].loss, 1e-5 * big->history()[i].loss) << i;
}

TEST(Trainer, CheckpointsAreAtomicAndPruned) {
  const std::string out = fresh_dir("prune");
  fs::create_directories(out + "/checkpoint-99.tmp");  // a save that crashed half-way
  auto t = make_trainer(config_for(out, "save_steps: 2\nsave_total_limit: 2\n"));
  t->run();
  EXPECT_FALSE(fs::exists(out + "/checkpoint-2"));
  EXPECT_TRUE(fs::exists(out + "/checkpoint-4"));
  EXPECT_TRUE(fs::exists(out + "/checkpoint-6"));
  EXPECT_TRUE(fs::exists(out + "/checkpoint-6/trainer_state.json"));
  EXPECT_TRUE(fs::exists(out + "/checkpoint-6/train_config.yaml"));
  EXPECT_EQ(latest_checkpoint(out), out + "/checkpoint-6");  // never the .tmp folder
  EXPECT_TRUE(fs::exists(out + "/metrics.jsonl"));
  EXPECT_TRUE(fs::exists(out + "/config.json"));
  EXPECT_TRUE(fs::exists(out + "/model.safetensors"));
}

TEST(Trainer, NonFiniteLossStopsNamingTheStep) {
  auto t = make_trainer(config_for(fresh_dir("nan"), "learning_rate: 1.0e+30\nmax_grad_norm: 0\nwarmup_steps: 0\n"));
  try {
    t->run();
    FAIL() << "expected the run to stop";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("at step"), std::string::npos) << e.what();
  }
}

TEST(Trainer, StepCountsFollowHuggingFace) {
  TrainConfig c = config_for("unused", "max_steps: -1\nnum_train_epochs: 2.5\ngradient_accumulation_steps: 3\n");
  EXPECT_EQ(count_total_steps(c, 10), 8);  // floor(10 / 3) = 3 per epoch, ceil(2.5 * 3) = 8
  EXPECT_EQ(count_total_steps(c, 2), 3);   // at least one step per epoch
}

std::string file_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The UserError trainer.run() throws; "" when it throws none.
std::string run_error(Trainer& trainer) {
  try {
    trainer.run();
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

// resume_from_checkpoint: true where there is nothing to resume stops, as Hugging Face's Trainer
// does, instead of training from scratch over the finished run; a resume that fails leaves the
// run's train_config.yaml as it was.
TEST(Trainer, ResumeWithoutACheckpointStopsAndKeepsTheEarlierRun) {
  const std::string dir = fresh_dir("finished");
  ASSERT_TRUE(make_trainer(config_for(dir, "save_steps: 0\n"))->run());
  const std::string config = file_text(dir + "/train_config.yaml"), metrics = file_text(dir + "/metrics.jsonl");
  auto resumed = make_trainer(config_for(dir, "save_steps: 0\nresume_from_checkpoint: true\n"));
  const std::string error = run_error(*resumed);
  EXPECT_NE(error.find("no valid checkpoint found in output_dir " + dir), std::string::npos) << error;
  EXPECT_EQ(file_text(dir + "/train_config.yaml"), config);
  EXPECT_EQ(file_text(dir + "/metrics.jsonl"), metrics);
}

TEST(Trainer, FailedResumeKeepsTheRunsTrainConfig) {
  const std::string dir = fresh_dir("damaged");
  ASSERT_TRUE(make_trainer(config_for(dir))->run());
  std::ofstream(dir + "/checkpoint-6/trainer_state.json") << "{";
  const std::string config = file_text(dir + "/train_config.yaml");
  auto resumed = make_trainer(config_for(dir, "resume_from_checkpoint: " + dir + "/checkpoint-6\n"));
  EXPECT_NE(run_error(*resumed).find("trainer_state.json"), std::string::npos);
  EXPECT_EQ(file_text(dir + "/train_config.yaml"), config);
}

TEST(Trainer, ResumeFromCheckpointReadsBooleansLikeEveryOtherKey) {
  const std::string dir = fresh_dir("resume-flag");
  for (const char* no : {"false", "False", "no", "0"})
    EXPECT_EQ(checkpoint_to_resume(config_for(dir, std::string("resume_from_checkpoint: \"") + no + "\"\n")), "") << no;
  for (const char* yes : {"true", "True", "yes", "1"})
    EXPECT_THROW(checkpoint_to_resume(config_for(dir, std::string("resume_from_checkpoint: ") + yes + "\n")), UserError)
        << yes;
}

}  // namespace
}  // namespace fab
