// The trainer: exact resume, gradient accumulation equal to one big batch, checkpoints that are
// atomic and pruned, NaN stops with the step, the final HF folder loads back.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "core/backend.h"
#include "core/error.h"
#include "io/safetensors.h"
#include "models/hf_model.h"
#include "train/checkpoint.h"
#include "train/synthetic_data.h"
#include "parallel/parallelize.h"
#include "train/trainer.h"
#include "test_util.h"

namespace fab {
namespace {
namespace fs = std::filesystem;

using test::fresh_dir;

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
                                "weight_decay: 0.1\nsave_steps: 3\nseed: 5\n",
                            "test.yaml", test::as_overrides(extra));
}

std::unique_ptr<Trainer> make_trainer(const TrainConfig& c) {
  auto model = load_model_folder(c.model_name_or_path, {c.bf16 ? Precision::bf16 : Precision::fp32, false, 64},
                                 uint64_t(c.seed));
  TrainData data{test::synthetic_samples(20, 1), test::synthetic_samples(5, 2), 0};
  return std::make_unique<Trainer>(c, parallelize(std::move(model), nullptr, c), std::move(data));
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

// The micro-batches of a step are collated one at a time: accumulating 1024 of them takes about
// the activation memory of one, the longest (all collated up front took 5.6 GB at 1e6).
size_t activation_peak_of_one_step(int64_t accumulation) {
  auto t = make_trainer(config_for(fresh_dir("ga-memory"), "max_steps: 1\nsave_steps: 0\ngradient_accumulation_steps: " +
                                                              std::to_string(accumulation) + "\n"));
  Allocator& host = backend(DeviceKind::cpu).allocator();
  host.reset_peaks();
  const size_t before = host.stats(MemoryCategory::activations).live;
  t->run();
  return host.stats(MemoryCategory::activations).peak - before;
}

TEST(Trainer, AccumulationMemoryDoesNotGrowWithTheSteps) {
  const size_t one = activation_peak_of_one_step(1), many = activation_peak_of_one_step(1024);
  EXPECT_LT(many, 2 * one) << "one micro-batch: " << one << " bytes, 1024: " << many;
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

// Every file of checkpoint folder `a` has the bytes of `b`'s (train_config.yaml names its run's keys).
void expect_same_checkpoint(const fs::path& a, const fs::path& b) {
  size_t files = 0;
  for (const auto& e : fs::directory_iterator(a)) {
    if (e.path().filename() == "train_config.yaml") continue;
    std::ifstream fa(e.path(), std::ios::binary), fb(b / e.path().filename(), std::ios::binary);
    ASSERT_TRUE(fb.good()) << b / e.path().filename();
    std::stringstream sa, sb;
    sa << fa.rdbuf(), sb << fb.rdbuf();
    EXPECT_TRUE(sa.str() == sb.str()) << e.path() << " differs";
    ++files;
  }
  EXPECT_GE(files, 4u);  // config, weights, trainer state, optimizer shard
}

TEST(Trainer, AsyncSaveWritesWhatASynchronousSaveWrites) {
  const std::string sync = fresh_dir("sync-save"), async = fresh_dir("async-save");
  auto a = make_trainer(config_for(sync));
  ASSERT_TRUE(a->run());
  auto b = make_trainer(config_for(async, "async_save: true\nsave_total_limit: 1\n"));
  ASSERT_TRUE(b->run());
  ASSERT_EQ(a->history().size(), b->history().size());
  for (size_t i = 0; i < a->history().size(); ++i) EXPECT_EQ(a->history()[i].loss, b->history()[i].loss);
  EXPECT_FALSE(fs::exists(async + "/checkpoint-3"));  // pruned by the writer once checkpoint-6 was complete
  expect_same_checkpoint(sync + "/checkpoint-6", async + "/checkpoint-6");
  for (const auto& e : fs::directory_iterator(async)) EXPECT_NE(e.path().extension(), ".tmp") << e.path();
}

TEST(Trainer, AsyncSaveFailureStopsTheRunOnTheTrainingThread) {
  const std::string out = fresh_dir("async-fail");
  // The writer pauses after the weights; meanwhile its folder goes, so the optimizer shard cannot be written.
  ::setenv("FAB_TEST_SLOW_SAVE_MS", "300", 1);
  std::thread remover([&] {
    const fs::path written = fs::path(out) / "checkpoint-3.tmp" / "trainer_state.json";
    // Generous: it ends when the file comes, however loaded the machine.
    for (int i = 0; i < 1200000 && !fs::exists(written); ++i) std::this_thread::sleep_for(std::chrono::microseconds(500));
    std::error_code error;  // the writer may be creating a file in it meanwhile: again until it is gone
    while (fs::exists(fs::path(out) / "checkpoint-3.tmp")) fs::remove_all(fs::path(out) / "checkpoint-3.tmp", error);
  });
  std::string error;
  try {
    make_trainer(config_for(out, "async_save: true\n"))->run();
  } catch (const UserError& e) {
    error = e.what();
  }
  remover.join();
  ::unsetenv("FAB_TEST_SLOW_SAVE_MS");
  EXPECT_NE(error.find("checkpoint-3 (written in the background, async_save)"), std::string::npos) << error;
  EXPECT_FALSE(fs::exists(out + "/checkpoint-3"));
}

// A run that saved checkpoint-3, then `edit` applied to the checkpoint; the resume's error.
std::string resume_error(const std::string& name, const std::function<void(const fs::path&)>& edit) {
  const std::string out = fresh_dir(name);
  make_trainer(config_for(out, "max_steps: 4\nsave_steps: 3\n"))->run();  // checkpoint-3, then the end
  fs::copy(out + "/checkpoint-3", out + "/edited", fs::copy_options::recursive);
  edit(fs::path(out) / "edited");
  try {
    make_trainer(config_for(out, "resume_from_checkpoint: " + out + "/edited\n"))->run();
  } catch (const UserError& e) {
    return e.what();
  }
  return "resumed";
}

void edit_trainer_state(const fs::path& checkpoint, const std::string& key, const nlohmann::json& value) {
  std::ifstream in(checkpoint / "trainer_state.json");
  nlohmann::json j = nlohmann::json::parse(in);
  j[key] = value;
  std::ofstream(checkpoint / "trainer_state.json") << j.dump();
}

TEST(Trainer, DamagedTrainerStateNamesTheFileAndField) {
  const std::string negative = resume_error("state-negative", [](const fs::path& c) {
    edit_trainer_state(c, "global_step", -7);  // trained at a negative learning rate
  });
  EXPECT_NE(negative.find("edited/trainer_state.json: global_step must be >= 0, got -7"), std::string::npos) << negative;
  const std::string short_losses = resume_error("state-short", [](const fs::path& c) {
    edit_trainer_state(c, "losses", nlohmann::json::array({1.0}));  // was read past its end
  });
  EXPECT_NE(short_losses.find("trainer_state.json: losses holds 1 values but global_step is 3"), std::string::npos)
      << short_losses;
}

TEST(Trainer, OptimizerShardStepMustBeAnInteger) {
  const std::string e = resume_error("shard-step", [](const fs::path& c) {
    const std::string path = (c / "optimizer-rank-0-of-1.safetensors").string();
    {
      const SafetensorsFile f = SafetensorsFile::open(path);
      save_safetensors(path + ".new", {{"exp_avg", f.tensor("exp_avg")}, {"exp_avg_sq", f.tensor("exp_avg_sq")}},
                       {{"step", "abc"}, {"segments", f.metadata().at("segments")}});
    }
    fs::rename(path + ".new", path);
  });
  EXPECT_NE(e.find("optimizer-rank-0-of-1.safetensors: metadata \"step\" must be a non-negative integer, got \"abc\""),
            std::string::npos)
      << e;
}

TEST(Trainer, ResumingWithOtherBatchesSaysWhatChanged) {
  const std::string out = fresh_dir("resume-changed");
  make_trainer(config_for(out, "max_steps: 4\nsave_steps: 3\n"))->run();  // checkpoint-3, then the end
  ::testing::internal::CaptureStdout();
  make_trainer(config_for(out, "max_steps: 5\nseed: 6\ngradient_accumulation_steps: 1\nresume_from_checkpoint: " + out + "/checkpoint-3\n"))
      ->run();
  const std::string printed = ::testing::internal::GetCapturedStdout();
  EXPECT_NE(printed.find("note: resuming with gradient_accumulation_steps 2 -> 1, seed 5 -> 6:"), std::string::npos)
      << printed;
  EXPECT_NE(printed.find("no longer that run's exactly"), std::string::npos) << printed;
}

TEST(Trainer, NonFiniteStepStopsNamingTheStep) {
  auto t = make_trainer(config_for(fresh_dir("nan"), "learning_rate: 1.0e+30\nmax_grad_norm: 0\nwarmup_steps: 0\n"));
  try {
    t->run();
    FAIL() << "expected the run to stop";
  } catch (const UserError& e) {
    // lr 1e30 leaves the loss finite at step 2 but not the gradient (fault_policy_test.sh sees a loss).
    EXPECT_EQ(std::string(e.what()).rfind("step 2: the gradient norm", 0), 0u) << e.what();
    EXPECT_NE(std::string(e.what()).find("stopping, saving nothing new (nan_policy: stop)"), std::string::npos)
        << e.what();
  }
}

TEST(Trainer, StepCountsFollowHuggingFace) {
  TrainConfig c = config_for("unused", "max_steps: -1\nnum_train_epochs: 2.5\ngradient_accumulation_steps: 3\n");
  EXPECT_EQ(count_total_steps(c, 10), 8);  // floor(10 / 3) = 3 per epoch, ceil(2.5 * 3) = 8
  EXPECT_EQ(count_total_steps(c, 2), 3);   // at least one step per epoch
  c.num_train_epochs = 1e300;  // was -9223372036854775808 steps, and an untrained model exported
  try {
    count_total_steps(c, 10);
    FAIL() << "1e300 epochs accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("num_train_epochs 1e+300 gives"), std::string::npos) << e.what();
  }
}

// MFU's FLOPs: a reward model runs its C x 1 value head, not the V x C vocabulary head (its MFU
// read 136% with the head counted).
TEST(Trainer, RewardModelFlopsLeaveOutTheVocabularyHead) {
  ModelConfig m;
  m.vocab_size = 1000, m.hidden_size = 16, m.intermediate_size = 32, m.num_hidden_layers = 2;
  m.num_attention_heads = 2, m.num_key_value_heads = 2, m.head_dim = 8, m.tie_word_embeddings = true;
  const double attention = 6.0 * 2 * 50 * 16, table = 1000.0 * 16;  // causal: 6 L T C
  const double tied_lm = training_flops_per_token(m, 50, false);
  EXPECT_DOUBLE_EQ(tied_lm, 6.0 * double(m.num_parameters()) + attention);  // the tied table is the head
  EXPECT_DOUBLE_EQ(training_flops_per_token(m, 50, true), tied_lm - 6 * (table - 16));
  m.tie_word_embeddings = false;  // the embedding is a lookup; the reward model runs neither table
  EXPECT_DOUBLE_EQ(training_flops_per_token(m, 50, false), 6.0 * (double(m.num_parameters()) - table) + attention);
  EXPECT_DOUBLE_EQ(training_flops_per_token(m, 50, true), 6.0 * (double(m.num_parameters()) - 2 * table + 16) + attention);
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
  const auto checkpoint_to_resume = [](const TrainConfig& c) {
    return fab::checkpoint_to_resume(c.resume_from_checkpoint, c.output_dir);
  };
  for (const char* no : {"false", "False", "no", "0"})
    EXPECT_EQ(checkpoint_to_resume(config_for(dir, std::string("resume_from_checkpoint: \"") + no + "\"\n")), "") << no;
  for (const char* yes : {"true", "True", "yes", "1"})
    EXPECT_THROW(checkpoint_to_resume(config_for(dir, std::string("resume_from_checkpoint: ") + yes + "\n")), UserError)
        << yes;
}

}  // namespace
}  // namespace fab
