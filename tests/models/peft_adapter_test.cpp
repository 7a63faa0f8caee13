// Adapters written by PyPI peft (tests/reference/peft, made by tests/reference/make_peft_fixture.py
// with peft 0.18.1 and transformers 5.6): Fabrica loads base + adapter (rsLoRA, every projection,
// lm_head in modules_to_save) and gives peft's logits, with the adapters and merged into the base.
#include <gtest/gtest.h>

#include <filesystem>

#include "io/safetensors.h"
#include "models/hf_model.h"
#include "models/peft_adapter.h"
#include "train/finetuning.h"
#include "test_util.h"

namespace fab {
namespace {

const std::string kFixture = std::string(FAB_SOURCE_DIR) + "/tests/reference/peft";

std::unique_ptr<DecoderModel> peft_model() {
  DecoderOptions options(Precision::fp32, false, 64);
  use_lora(read_adapter_config(kFixture + "/adapter"), options);
  auto model = load_model_folder(kFixture + "/base", options);
  load_adapter(*model, kFixture + "/adapter");
  return model;
}

TEST(PeftAdapter, ReadsPeftsConfig) {
  const LoraOptions o = read_adapter_config(kFixture + "/adapter");
  EXPECT_EQ(o.rank, 4);
  EXPECT_EQ(o.effective_alpha(), 8.0);
  EXPECT_TRUE(o.rslora);
  EXPECT_FLOAT_EQ(o.scaling(), 4.0f);  // alpha / sqrt(r)
  EXPECT_EQ(o.targets.size(), 7u);
  EXPECT_EQ(o.modules_to_save, std::vector<std::string>{"lm_head"});
}

TEST(PeftAdapter, LogitsEqualPefts) {
  const SafetensorsFile ref = SafetensorsFile::open(kFixture + "/logits.safetensors");
  auto model = peft_model();
  test::expect_close(model->logits(ref.tensor("input_ids")), ref.tensor("logits"), 1e-5, "logits with the adapter");
  merge_adapters(*model);
  test::expect_close(model->logits(ref.tensor("input_ids")), ref.tensor("logits"), 1e-5, "merged logits");
}

// What Fabrica writes back is PEFT's file: the same key set and the same tensors.
TEST(PeftAdapter, WritesBackPeftsKeys) {
  auto model = peft_model();
  const std::string dir = test::scratch_path("peft-roundtrip");
  std::filesystem::remove_all(dir);
  save_adapter(*model, dir, kFixture + "/base");
  const SafetensorsFile mine = SafetensorsFile::open(dir + "/adapter_model.safetensors");
  const SafetensorsFile peft = SafetensorsFile::open(kFixture + "/adapter/adapter_model.safetensors");
  EXPECT_EQ(mine.names(), peft.names());
  for (const std::string& name : peft.names())
    test::expect_close(mine.tensor(name), peft.tensor(name), 0.0, name);
  EXPECT_EQ(read_adapter_config(dir).targets.size(), 7u);
}

}  // namespace
}  // namespace fab
