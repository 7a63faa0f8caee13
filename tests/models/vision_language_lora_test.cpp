// LoRA on Qwen2-VL and Qwen2.5-VL against PEFT on transformers 5 (tests/reference/vlm/NAME_lora
// and NAME_lora_reference.safetensors, made by tests/reference/make_vlm_lora_fixture.py with
// LLaMA-Factory's own target resolution): the targets of lora_target all (the tower's blocks with
// freeze_vision_tower false, never the merger or the patch embedding), logits, loss and every
// adapter's gradient on a batch with images, the adapter written back with PEFT's keys and
// target_modules, and the merge equal to merge_and_unload's weights.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/safetensors.h"
#include "models/hf_model.h"
#include "models/peft_adapter.h"
#include "train/finetuning.h"
#include "test_util.h"

namespace fab {
namespace {

const std::string kFixture = std::string(FAB_SOURCE_DIR) + "/tests/reference/vlm";
const std::string kPeftPrefix = "base_model.model.";

struct LoraCase {
  std::string type;
  SafetensorsFile batch, ref;
  explicit LoraCase(const std::string& t)
      : type(t),
        batch(SafetensorsFile::open(kFixture + "/" + t + "_reference.safetensors")),
        ref(SafetensorsFile::open(kFixture + "/" + t + "_lora_reference.safetensors")) {}
  std::string folder() const { return kFixture + "/" + type; }
  std::string adapter() const { return kFixture + "/" + type + "_lora"; }
  SequenceLayout images() const {
    SequenceLayout layout;
    layout.pixel_values = batch.tensor("pixel_values");
    layout.image_grid_thw = batch.tensor("image_grid_thw");
    return layout;
  }
};

std::unique_ptr<DecoderModel> peft_model(const LoraCase& r) {
  DecoderOptions options(Precision::fp32, false, 64);
  use_lora(read_adapter_config(r.adapter()), options);
  auto model = load_model_folder(r.folder(), options);
  load_adapter(*model, r.adapter());
  return model;
}

// The adapter tensors `fabrica train` would give the model for these settings, by PEFT's names.
std::set<std::string> trained_adapters(const LoraCase& r, const std::string& settings) {
  const TrainConfig c = parse_train_config("model_name_or_path: " + r.folder() +
                                               "\nstage: sft\nfinetuning_type: lora\nlora_rank: 4\noutput_dir: " +
                                               test::fresh_dir("vlm-lora-" + r.type) + "\n",
                                           "test.yaml", test::as_overrides(settings));
  const ModelConfig mc = load_model_config(r.folder() + "/config.json");
  DecoderOptions options(Precision::fp32, false, 64);
  apply_finetuning(c, mc.num_hidden_layers, options);
  apply_multimodal_freezing(c, mc, options);
  auto model = load_model_folder(r.folder(), options);
  std::set<std::string> names;
  for (const ParamInfo& p : model->params().params()) names.insert(kPeftPrefix + saved_name(mc, p.name));
  return names;
}

// The modules an adapter folder's target_modules adapt on a `qwen2_5` tower or not: (language
// model's, tower's) names.
std::pair<std::set<std::string>, std::set<std::string>> adapted_modules(const std::string& adapter_dir, bool qwen2_5) {
  const LoraOptions o = read_adapter_config(adapter_dir);
  const std::vector<std::string> linears = vision_lora_names(qwen2_5);
  std::set<std::string> tower;
  for (const std::string& t : o.vision_targets)
    if (std::find(linears.begin(), linears.end(), t) != linears.end()) tower.insert(t);
  return {{o.targets.begin(), o.targets.end()}, tower};
}

class VisionLanguageLora : public ::testing::TestWithParam<std::string> {};

TEST_P(VisionLanguageLora, LlamaFactorysTargetsOnTheTowerAndLanguageModel) {
  const LoraCase r(GetParam());
  const std::vector<std::string> peft = SafetensorsFile::open(r.adapter() + "/adapter_model.safetensors").names();
  EXPECT_EQ(trained_adapters(r, "freeze_vision_tower: false\n"), std::set<std::string>(peft.begin(), peft.end()));
  // The default frozen tower: the language model's seven projections in each of its 2 layers.
  const std::set<std::string> language = trained_adapters(r, "");
  EXPECT_EQ(language.size(), 2u * 7 * 2);
  for (const std::string& name : language)
    EXPECT_EQ(name.rfind(kPeftPrefix + "model.language_model.layers.", 0), 0u) << name;
  // freeze_language_model: the tower's blocks only.
  for (const std::string& name : trained_adapters(r, "freeze_vision_tower: false\nfreeze_language_model: true\n"))
    EXPECT_EQ(name.rfind(kPeftPrefix + "model.visual.blocks.", 0), 0u) << name;
  // An explicit list is matched as LLaMA-Factory does, by substring: proj takes attn.proj and the
  // language model's projections, never the patch embedding's proj.
  const std::set<std::string> proj = trained_adapters(r, "freeze_vision_tower: false\nlora_target: proj\n");
  EXPECT_TRUE(proj.count(kPeftPrefix + "model.visual.blocks.0.attn.proj.lora_A.weight"));
  EXPECT_TRUE(proj.count(kPeftPrefix + "model.language_model.layers.1.mlp.down_proj.lora_B.weight"));
  EXPECT_FALSE(proj.count(kPeftPrefix + "model.visual.blocks.0.attn.qkv.lora_A.weight"));
  EXPECT_THROW(trained_adapters(r, "freeze_language_model: true\n"), UserError);  // nothing left to adapt
}

TEST_P(VisionLanguageLora, LogitsLossAndAdapterGradientsEqualPefts) {
  const LoraCase r(GetParam());
  auto model = peft_model(r);
  const Tensor ids = r.batch.tensor("input_ids"), labels = r.batch.tensor("labels");
  test::expect_close(model->logits(ids, r.images()), r.ref.tensor("logits"), 1e-5, "logits");
  const int64_t targets = DecoderModel::count_targets(labels);
  const double loss = model->forward_backward(ids, labels, 1.0f / float(targets), r.images()) / double(targets);
  const double peft_loss = r.ref.tensor("loss").data<float>()[0];
  EXPECT_NEAR(loss, peft_loss, 1e-5 * peft_loss);
  size_t compared = 0;
  for (const ParamInfo& p : model->params().params()) {
    const std::string name = "grad." + kPeftPrefix + saved_name(model->config(), p.name);
    test::expect_close(model->params().grads().view(p.offset, p.shape), r.ref.tensor(name), 1e-5, name);
    ++compared;
  }
  const std::vector<std::string> names = r.ref.names();
  EXPECT_EQ(compared, size_t(std::count_if(names.begin(), names.end(),
                                           [](const std::string& n) { return n.rfind("grad.", 0) == 0; })));
}

TEST_P(VisionLanguageLora, WritesBackPeftsAdapter) {
  const LoraCase r(GetParam());
  auto model = peft_model(r);
  const std::string dir = test::fresh_dir("vlm-lora-save-" + r.type);
  save_adapter(*model, dir, r.folder());
  const SafetensorsFile mine = SafetensorsFile::open(dir + "/adapter_model.safetensors");
  const SafetensorsFile peft = SafetensorsFile::open(r.adapter() + "/adapter_model.safetensors");
  EXPECT_EQ(mine.names(), peft.names());
  for (const std::string& name : peft.names()) test::expect_close(mine.tensor(name), peft.tensor(name), 0.0, name);
  // Fabrica writes LLaMA-Factory's full module names, peft its shortest suffixes: the same modules.
  const bool qwen2_5 = r.type == "qwen2_5_vl";
  EXPECT_EQ(adapted_modules(dir, qwen2_5), adapted_modules(r.adapter(), qwen2_5));
  std::ifstream in(dir + "/adapter_config.json");
  const auto written = nlohmann::json::parse(in)["target_modules"].get<std::vector<std::string>>();
  EXPECT_EQ(written.size(), SafetensorsFile::open(r.adapter() + "/adapter_model.safetensors").names().size() / 2);
}

TEST_P(VisionLanguageLora, MergeEqualsMergeAndUnload) {
  const LoraCase r(GetParam());
  auto model = peft_model(r);
  merge_adapters(*model);
  size_t merged = 0;
  for (const auto& [p, buffer] : model->base_parameters()) {
    const std::string name = "merged." + saved_name(model->config(), p->name);
    if (!r.ref.contains(name)) continue;
    test::expect_close(buffer->values_f32(*p), r.ref.tensor(name), 1e-6, name);
    ++merged;
  }
  const std::vector<std::string> names = r.ref.names();
  EXPECT_EQ(merged, size_t(std::count_if(names.begin(), names.end(),
                                         [](const std::string& n) { return n.rfind("merged.", 0) == 0; })));
  EXPECT_EQ(merged, SafetensorsFile::open(r.adapter() + "/adapter_model.safetensors").names().size() / 2);
  test::expect_close(model->logits(r.batch.tensor("input_ids"), r.images()), r.ref.tensor("merged_logits"), 1e-5,
                     "merged logits");
}

INSTANTIATE_TEST_SUITE_P(Qwen, VisionLanguageLora, ::testing::Values("qwen2_vl", "qwen2_5_vl"));

}  // namespace
}  // namespace fab
