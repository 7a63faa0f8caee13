// Mixture-of-experts folders that are wrong: one clear UserError each, naming what is wrong.
#include <filesystem>
#include <fstream>
#include <regex>

#include "core/error.h"
#include "io/safetensors.h"
#include "models/hf_model.h"
#include "test_util.h"

namespace fab {
namespace {

namespace fs = std::filesystem;

std::string fixture(const std::string& name) { return std::string(FAB_SOURCE_DIR) + "/tests/reference/moe/" + name; }

// A copy of fixture `name` whose weights `edit` changed and whose config.json `config_edit` changed.
std::string broken_copy(const std::string& name, const std::string& tag,
                        const std::function<void(std::vector<NamedTensor>&)>& edit,
                        const std::pair<std::string, std::string>& config_edit = {}) {
  const std::string dir = test::fresh_dir("moe_bad_" + tag);
  const SafetensorsFile f = SafetensorsFile::open(fixture(name) + "/model.safetensors");
  std::vector<NamedTensor> tensors;
  for (const auto& [n, entry] : f.entries()) tensors.push_back({n, f.as_f32(n)});
  edit(tensors);
  save_safetensors(dir + "/model.safetensors", tensors, {{"format", "pt"}});
  std::ifstream in(fixture(name) + "/config.json");
  std::string config((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!config_edit.first.empty()) config = std::regex_replace(config, std::regex(config_edit.first), config_edit.second);
  std::ofstream(dir + "/config.json") << config;
  return dir;
}

std::string load_error(const std::string& dir) {
  try {
    load_model_folder(dir, DecoderOptions(Precision::fp32, false, 16));
  } catch (const UserError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(MoeBadInput, MissingExpertTensorIsNamed) {
  const std::string dir = broken_copy("qwen2_moe", "missing", [](std::vector<NamedTensor>& t) {
    std::erase_if(t, [](const NamedTensor& x) { return x.name == "model.layers.1.mlp.experts.2.up_proj.weight"; });
  });
  EXPECT_NE(load_error(dir).find("missing tensor \"model.layers.1.mlp.experts.2.up_proj.weight\""), std::string::npos)
      << load_error(dir);
}

TEST(MoeBadInput, FusedAndPerExpertMixIsRefused) {
  const std::string dir = broken_copy("mixtral", "mix", [](std::vector<NamedTensor>& t) {
    t.push_back({"model.layers.1.mlp.experts.down_proj", Tensor::zeros({4, 16, 8}, DType::f32, MemoryCategory::parameters)});
  });
  const std::string error = load_error(dir);
  EXPECT_NE(error.find("mix transformers 5's fused experts"), std::string::npos) << error;
  EXPECT_NE(error.find("model.layers.1.mlp.experts.down_proj"), std::string::npos) << error;
}

TEST(MoeBadInput, MoeIntermediateSizeMismatchingTheTensors) {
  const std::string dir = broken_copy("qwen3_moe_fused", "intermediate", [](std::vector<NamedTensor>&) {},
                                      {"\"moe_intermediate_size\": 8", "\"moe_intermediate_size\": 6"});
  const std::string error = load_error(dir);
  EXPECT_NE(error.find("experts.gate_up_proj\" has shape (4, 16, 16) but config.json implies (4, 12, 16)"),
            std::string::npos)
      << error;
}

TEST(MoeBadInput, TopKAboveTheExpertsIsRefused) {
  const std::string dir = broken_copy("mixtral", "topk", [](std::vector<NamedTensor>&) {},
                                      {"\"num_experts_per_tok\": 2", "\"num_experts_per_tok\": 5"});
  EXPECT_NE(load_error(dir).find("num_experts_per_tok 5 must be between 1 and the number of experts (4)"),
            std::string::npos)
      << load_error(dir);
}

TEST(MoeBadInput, RouterJitterIsRefused) {
  const std::string dir = broken_copy("mixtral", "jitter", [](std::vector<NamedTensor>&) {},
                                      {"\"router_jitter_noise\": 0.0", "\"router_jitter_noise\": 0.1"});
  EXPECT_NE(load_error(dir).find("router_jitter_noise 0.1 is not implemented"), std::string::npos) << load_error(dir);
}

TEST(MoeBadInput, UnsupportedCombinationsAreRefused) {
  const ModelConfig config = load_model_config(fixture("qwen3_moe") + "/config.json");
  DecoderOptions stage(Precision::fp32, false, 16);
  stage.stage = PipelineStage{{{0, 1}}, true, false};
  EXPECT_THROW(DecoderModel(config, stage), UserError);
}

// No model_type is both (a qwen2_vl config.json's MoE-looking keys are not read); a config built in
// code with a vision tower and experts is refused by name.
TEST(MoeBadInput, VisionLanguageWithExpertsIsRefused) {
  ModelConfig config = load_model_config(std::string(FAB_SOURCE_DIR) + "/tests/reference/vlm/qwen2_vl/config.json");
  EXPECT_FALSE(config.is_moe());
  config.moe = load_model_config(fixture("qwen3_moe") + "/config.json").moe;
  try {
    DecoderModel(config, DecoderOptions(Precision::fp32, false, 16));
    ADD_FAILURE() << "a vision-language model with experts was accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("vision-language model with a mixture of experts"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace fab
