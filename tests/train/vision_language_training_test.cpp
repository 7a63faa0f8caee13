// A vision-language model through the Trainer: micro-batches carry their rows' images
// (TrainData::train_images, collate), LanguageModelStage hands them to the model, and three
// optimizer steps on the fixture's batch give transformers' AdamW losses
// (tests/reference/make_vlm_fixture.py); LLaMA-Factory's freezing keys choose what trains, LoRA
// included.
#include <gtest/gtest.h>

#include "core/error.h"
#include "io/safetensors.h"
#include "models/hf_model.h"
#include "parallel/parallelize.h"
#include "train/finetuning.h"
#include "train/trainer.h"
#include "test_util.h"

namespace fab {
namespace {

const std::string kFixture = std::string(FAB_SOURCE_DIR) + "/tests/reference/vlm";

TrainConfig vlm_config(const std::string& type, const std::string& extra = "") {
  return parse_train_config("model_name_or_path: " + kFixture + "/" + type + "\nstage: sft\noutput_dir: " +
                                test::fresh_dir("vlm-train-" + type) +
                                "\nmax_steps: 3\nper_device_train_batch_size: 2\ngradient_accumulation_steps: 1\n"
                                "learning_rate: 1.0e-3\nlr_scheduler_type: constant\nweight_decay: 0.01\n"
                                "max_grad_norm: 0\nshuffle: false\nlogging_steps: 1\nsave_steps: 0\n",
                            "test.yaml", test::as_overrides(extra));
}

std::unique_ptr<DecoderModel> vlm_model(const TrainConfig& c) {
  DecoderOptions options(Precision::fp32, false, 64);
  const ModelConfig mc = load_model_config(c.model_name_or_path + "/config.json");
  apply_finetuning(c, mc.num_hidden_layers, options);
  apply_multimodal_freezing(c, mc, options);
  return load_model_folder(c.model_name_or_path, options, uint64_t(c.seed));
}

// The fixture's two rows as two sequences, each with its own images.
TrainData fixture_data(const SafetensorsFile& ref) {
  const Tensor ids = ref.tensor("input_ids"), labels = ref.tensor("labels");
  const Tensor pixels = ref.tensor("pixel_values"), grid = ref.tensor("image_grid_thw");
  TokenSequencesBuilder builder;
  for (int64_t r = 0; r < ids.dim(0); ++r) {
    std::vector<int32_t> row, row_labels;
    for (int64_t t = 0; t < ids.dim(1); ++t) {
      row.push_back(int32_t(ids.data<int64_t>()[r * ids.dim(1) + t]));
      row_labels.push_back(int32_t(labels.data<int64_t>()[r * ids.dim(1) + t]));
    }
    builder.add(row, row_labels);
  }
  // Row 0 holds images 0 and 1, row 1 image 2.
  auto patches = [&](int64_t image) {
    const int64_t* g = grid.data<int64_t>() + 3 * image;
    return g[0] * g[1] * g[2];
  };
  const int64_t first = patches(0) + patches(1), values = pixels.dim(1);
  TrainData data{builder.finish(), TokenSequences{}, 0};
  data.train_images = {{pixels.view(0, {first, values}), grid.view(0, {2, 3})},
                       {pixels.view(first * values, {patches(2), values}), grid.view(6, {1, 3})}};
  return data;
}

class VisionLanguageTraining : public ::testing::TestWithParam<std::string> {};

TEST_P(VisionLanguageTraining, TrainerStepsFollowTransformersAdamW) {
  const SafetensorsFile ref = SafetensorsFile::open(kFixture + "/" + GetParam() + "_reference.safetensors");
  const TrainConfig c = vlm_config(GetParam(), "freeze_vision_tower: false\nfreeze_multi_modal_projector: false\n");
  Trainer trainer(c, parallelize(vlm_model(c), nullptr, c), fixture_data(ref));
  ASSERT_TRUE(trainer.run());
  ASSERT_EQ(trainer.history().size(), 3u);
  const float* hf = ref.tensor("adamw_losses").data<float>();
  for (size_t s = 0; s < 3; ++s) EXPECT_NEAR(trainer.history()[s].loss, hf[s], 1e-5 * hf[s]) << "step " << s + 1;
}

// LLaMA-Factory's defaults: the tower and the merger frozen, the language model trains; the
// frozen tower still shapes the loss, which falls.
TEST_P(VisionLanguageTraining, FreezesTheTowerAndProjectorByDefault) {
  const SafetensorsFile ref = SafetensorsFile::open(kFixture + "/" + GetParam() + "_reference.safetensors");
  const TrainConfig c = vlm_config(GetParam(), "learning_rate: 1.0e-2\nmax_steps: 4\n");
  auto model = vlm_model(c);
  EXPECT_FALSE(model->params().contains("model.visual.blocks.0.attn.qkv.weight"));
  EXPECT_FALSE(model->params().contains("model.visual.merger.mlp.0.weight"));
  EXPECT_TRUE(model->params().contains("model.layers.0.self_attn.q_proj.weight"));
  EXPECT_TRUE(model->params().contains("lm_head.weight"));
  Trainer trainer(c, parallelize(std::move(model), nullptr, c), fixture_data(ref));
  ASSERT_TRUE(trainer.run());
  const float* hf = ref.tensor("adamw_losses").data<float>();
  EXPECT_NEAR(trainer.history().front().loss, hf[0], 1e-5 * hf[0]);  // the same forward
  EXPECT_LT(trainer.history().back().loss, trainer.history().front().loss);
}

TEST_P(VisionLanguageTraining, FreezeLanguageModelTrainsOnlyTheVisionSide) {
  const TrainConfig c = vlm_config(GetParam(), "freeze_language_model: true\nfreeze_vision_tower: false\n");
  auto model = vlm_model(c);
  for (const ParamInfo& p : model->params().params())
    EXPECT_TRUE(p.name.rfind("model.visual.", 0) == 0 && p.name.rfind("model.visual.merger.", 0) != 0) << p.name;
  EXPECT_TRUE(model->params().contains("model.visual.patch_embed.proj.weight"));
}

// LoRA with the tower unfrozen: only adapters train (the language model's and the tower blocks'),
// B starts at zero so the first loss is the base model's (transformers'), and the loss falls.
TEST_P(VisionLanguageTraining, LoraTrainsTheAdaptersOfTowerAndLanguageModel) {
  const SafetensorsFile ref = SafetensorsFile::open(kFixture + "/" + GetParam() + "_reference.safetensors");
  const TrainConfig c = vlm_config(GetParam(), "finetuning_type: lora\nlora_rank: 4\nfreeze_vision_tower: false\n"
                                               "learning_rate: 1.0e-2\n");
  auto model = vlm_model(c);
  for (const ParamInfo& p : model->params().params()) EXPECT_TRUE(model->is_adapter(p.name)) << p.name;
  EXPECT_TRUE(model->params().contains("model.visual.blocks.1.attn.qkv.lora_A.weight"));
  Trainer trainer(c, parallelize(std::move(model), nullptr, c), fixture_data(ref));
  ASSERT_TRUE(trainer.run());
  const float* hf = ref.tensor("adamw_losses").data<float>();
  EXPECT_NEAR(trainer.history().front().loss, hf[0], 1e-5 * hf[0]);
  EXPECT_LT(trainer.history().back().loss, trainer.history().front().loss);
}

INSTANTIATE_TEST_SUITE_P(Qwen, VisionLanguageTraining, ::testing::Values("qwen2_vl", "qwen2_5_vl"));

}  // namespace
}  // namespace fab
