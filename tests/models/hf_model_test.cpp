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

// A path in this process's scratch folder with nothing there yet.
std::string fresh_dir(const std::string& name) {
  const std::string dir = test::scratch_path(name);
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

// The UserError load_model_folder(dir) throws; "" when it throws none.
std::string load_error(const std::string& dir) {
  try {
    load_model_folder(dir, {Precision::fp32, false, 32});
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

// A folder with the weights saved, then `weights` renamed to `name` (another format's file name).
std::string folder_with_weights_named(const std::string& test, const std::string& name) {
  DecoderModel model(small_config(), {Precision::fp32, false, 32});
  model.init_random(3);
  const std::string dir = fresh_dir(test);
  save_model_folder(model, dir);
  fs::rename(dir + "/model.safetensors", dir + "/" + name);
  return dir;
}

TEST(HfModel, PickleWeightsAreRefusedWithTheConversionCommand) {
  const std::string hf = load_error(folder_with_weights_named("pickle-bin", "pytorch_model.bin"));
  EXPECT_NE(hf.find("pytorch_model.bin: pickle checkpoints are not loaded; convert to safetensors"), std::string::npos)
      << hf;
  EXPECT_NE(hf.find("save_pretrained("), std::string::npos) << hf;
  EXPECT_EQ(hf.find('\n'), std::string::npos) << hf;
  const std::string pt = load_error(folder_with_weights_named("pickle-pt", "consolidated.pt"));
  EXPECT_NE(pt.find("consolidated.pt: pickle checkpoints are not loaded"), std::string::npos) << pt;
  EXPECT_NE(pt.find("safetensors.torch import save_file"), std::string::npos) << pt;
}

TEST(HfModel, ShardsWithoutTheirIndexAreRefusedNamingIt) {
  DecoderModel model(small_config(), {Precision::fp32, false, 32});
  const std::string dir = fresh_dir("shards-no-index");
  save_model_folder(model, dir, 4096);
  fs::remove(dir + "/model.safetensors.index.json");
  const std::string error = load_error(dir);
  EXPECT_NE(error.find("model-00001-of-"), std::string::npos) << error;
  EXPECT_NE(error.find("without model.safetensors.index.json"), std::string::npos) << error;
}

TEST(HfModel, OtherWeightFormatsAreRefusedAndTrainerStateIsNotWeights) {
  EXPECT_NE(load_error(folder_with_weights_named("gguf", "model.gguf")).find("model.gguf: weights in a format"),
            std::string::npos);
  // What HF's Trainer saves beside weights does not count as weights: this folder starts from scratch.
  const std::string dir = folder_with_weights_named("trainer-state", "training_args.bin");
  EXPECT_EQ(load_error(dir), "");
  EXPECT_FALSE(HfWeights::present(dir));
}

}  // namespace
}  // namespace fab
