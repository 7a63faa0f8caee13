// HF model folders: save and load back (single file and sharded), from-scratch folders, and
// clear errors for weights that do not fit the config.
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "models/hf_model.h"
#include "test_util.h"

namespace fab {
namespace {
namespace fs = std::filesystem;

ModelConfig small_config() {
  return parse_model_config(
      R"({"model_type":"qwen2","vocab_size":50,"hidden_size":16,"intermediate_size":24,"num_hidden_layers":2,
          "num_attention_heads":4,"num_key_value_heads":2,"tie_word_embeddings":true})",
      "test");
}

std::string fresh_dir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/" + name;
  fs::remove_all(dir);
  return dir;
}

void expect_same_weights(const DecoderModel& a, const DecoderModel& b) {
  ASSERT_EQ(a.params().numel(), b.params().numel());
  EXPECT_EQ(0, std::memcmp(a.params().values().raw(), b.params().values().raw(), a.params().values().bytes()));
}

TEST(HfModel, SaveAndLoadRoundTripSingleFileAndSharded) {
  DecoderModel model(small_config(), {Precision::fp32, false, 32});
  model.init_random(3);
  for (size_t shard_bytes : {size_t(1) << 30, size_t(4096)}) {
    const std::string dir = fresh_dir("roundtrip-" + std::to_string(shard_bytes));
    save_model_folder(model, dir, shard_bytes);
    const bool sharded = shard_bytes == 4096;
    EXPECT_EQ(fs::exists(dir + "/model.safetensors.index.json"), sharded);
    EXPECT_EQ(fs::exists(dir + "/model.safetensors"), !sharded);
    auto loaded = load_model_folder(dir, {Precision::fp32, false, 32});
    EXPECT_EQ(loaded->config().model_type, "qwen2");
    EXPECT_TRUE(loaded->config().tie_word_embeddings);
    expect_same_weights(model, *loaded);
  }
}

TEST(HfModel, ConfigOnlyFolderMeansFromScratchAndIsSeeded) {
  DecoderModel model(small_config(), {Precision::fp32, false, 32});
  const std::string dir = fresh_dir("scratch");
  save_model_folder(model, dir);
  fs::remove(dir + "/model.safetensors");
  auto a = load_model_folder(dir, {Precision::fp32, false, 32}, 7);
  auto b = load_model_folder(dir, {Precision::fp32, false, 32}, 7);
  expect_same_weights(*a, *b);
  EXPECT_NE(a->params().values().data<float>()[0], 0.0f);
}

TEST(HfModel, WeightsThatDoNotFitTheConfigAreNamed) {
  DecoderModel model(small_config(), {Precision::fp32, false, 32});
  const std::string dir = fresh_dir("mismatch");
  save_model_folder(model, dir);
  // Same weights, but a config with a wider MLP.
  std::ofstream(dir + "/config.json") << R"({"model_type":"qwen2","vocab_size":50,"hidden_size":16,
      "intermediate_size":32,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,
      "tie_word_embeddings":true})";
  try {
    load_model_folder(dir, {Precision::fp32, false, 32});
    FAIL() << "expected a UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers.0.mlp.gate_proj.weight"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace fab
