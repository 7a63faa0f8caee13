// save_only_model, as Hugging Face's Trainer means it: checkpoints hold the weights, the trainer
// state and the config but no optimizer state, and a run cannot resume from them (refused,
// naming the checkpoint and the key) — it was "not implemented" before.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
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

const std::string& model_folder() {
  static const std::string dir = [] {
    const std::string d = fresh_dir("model");
    std::ofstream(d + "/config.json") << R"({"model_type":"llama","vocab_size":64,"hidden_size":32,
      "intermediate_size":48,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,
      "max_position_embeddings":64})";
    return d;
  }();
  return dir;
}

TrainConfig config_for(const std::string& output, const std::string& extra = "") {
  return parse_train_config("model_name_or_path: " + model_folder() + "\nstage: sft\noutput_dir: " + output +
                                "\nmax_steps: 6\nper_device_train_batch_size: 2\nlearning_rate: 1.0e-2\n"
                                "logging_steps: 1\nsave_steps: 3\nseed: 5\n",
                            "test.yaml", test::as_overrides(extra));
}

std::unique_ptr<Trainer> make_trainer(const TrainConfig& c) {
  auto model = load_model_folder(c.model_name_or_path, {Precision::fp32, false, 64}, uint64_t(c.seed));
  TrainData data{test::synthetic_samples(20, 1), test::synthetic_samples(5, 2), 0};
  return std::make_unique<Trainer>(c, parallelize(std::move(model), nullptr, c), std::move(data));
}

std::vector<std::string> files_of(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

std::string text_of(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string run_error(const TrainConfig& c) {
  try {
    make_trainer(c)->run();
  } catch (const UserError& e) {
    return e.what();
  }
  return "resumed";
}

TEST(SaveOnlyModel, CheckpointsHoldTheWeightsWithoutOptimizerState) {
  const std::string full = fresh_dir("full"), only = fresh_dir("only"), async = fresh_dir("only-async");
  ASSERT_TRUE(make_trainer(config_for(full))->run());
  ASSERT_TRUE(make_trainer(config_for(only, "save_only_model: true\n"))->run());
  ASSERT_TRUE(make_trainer(config_for(async, "save_only_model: true\nasync_save: true\n"))->run());
  EXPECT_EQ(files_of(full + "/checkpoint-3"),
            (std::vector<std::string>{"config.json", "model.safetensors", "optimizer-rank-0-of-1.safetensors",
                                      "train_config.yaml", "trainer_state.json"}));
  for (const std::string& out : {only, async}) {
    SCOPED_TRACE(out);
    EXPECT_EQ(files_of(out + "/checkpoint-3"),
              (std::vector<std::string>{"config.json", "model.safetensors", "train_config.yaml", "trainer_state.json"}));
    // The same training: the same weights, and the state says what the checkpoint lacks.
    EXPECT_EQ(test::expect_same_tensors(out + "/checkpoint-3/model.safetensors", full + "/checkpoint-3/model.safetensors"),
              size_t(3 + 2 * 9));  // embedding, norm, head; 9 per layer
    const auto state = nlohmann::json::parse(text_of(out + "/checkpoint-3/trainer_state.json"));
    EXPECT_EQ(state.at("save_only_model"), true);
    EXPECT_EQ(state.at("global_step"), 3);
    test::expect_same_tensors(out + "/model.safetensors", full + "/model.safetensors");
  }
  EXPECT_FALSE(nlohmann::json::parse(text_of(full + "/checkpoint-3/trainer_state.json")).contains("save_only_model"));
}

TEST(SaveOnlyModel, AResumeFromSuchACheckpointIsRefusedNamingItAndTheKey) {
  const std::string out = fresh_dir("refused");
  ASSERT_TRUE(make_trainer(config_for(out, "save_only_model: true\n"))->run());
  const std::string config = text_of(out + "/train_config.yaml"), metrics = text_of(out + "/metrics.jsonl");
  const std::string expected = "resume_from_checkpoint: " + out + "/checkpoint-3 was saved with save_only_model: true: "
                               "it holds the weights but no optimizer state, so the run cannot resume from it";
  for (const std::string& resume : {std::string("true"), out + "/checkpoint-3"}) {
    SCOPED_TRACE(resume);
    const TrainConfig c = config_for(out, "max_steps: 8\nresume_from_checkpoint: " + resume + "\n");
    try {
      checkpoint_to_resume(c.resume_from_checkpoint, c.output_dir);  // what `fabrica train` checks before it writes anything
      ADD_FAILURE() << "checkpoint_to_resume accepted it";
    } catch (const UserError& e) {
      EXPECT_EQ(std::string(e.what()).rfind(expected, 0), 0u) << e.what();
      EXPECT_NE(std::string(e.what()).find("fabrica export --checkpoint " + out + "/checkpoint-3"), std::string::npos)
          << e.what();
    }
    EXPECT_EQ(run_error(c).rfind(expected, 0), 0u);
  }
  EXPECT_EQ(text_of(out + "/train_config.yaml"), config);  // nothing of the run rewritten
  EXPECT_EQ(text_of(out + "/metrics.jsonl"), metrics);
  // A checkpoint with its optimizer state still resumes beside it.
  const std::string resumable = fresh_dir("resumable");
  ASSERT_TRUE(make_trainer(config_for(resumable))->run());
  const TrainConfig resume = config_for(resumable, "resume_from_checkpoint: true\n");
  EXPECT_EQ(checkpoint_to_resume(resume.resume_from_checkpoint, resume.output_dir), resumable + "/checkpoint-3");
}

TEST(SaveOnlyModel, RestartsNeedResumableCheckpoints) {
  try {
    config_for("out", "save_only_model: true\nmax_restarts: 2\n");
    FAIL() << "accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("max_restarts 2 with save_only_model: a restart resumes from the newest "
                                         "checkpoint"),
              std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(config_for("out", "save_only_model: true\n").save_only_model);
}

}  // namespace
}  // namespace fab
