// RoPE frequencies against transformers itself (tests/reference/rope_transformers.json, written by
// tests/reference/make_rope_reference.py with transformers' rotary embedding modules): the
// transformers-5 `rope_parameters` form, the transformers-4 `rope_theta` + `rope_scaling` form,
// and the linear, dynamic, yarn and llama3 types.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "models/decoder.h"
#include "models/model_config.h"

namespace fab {
namespace {

using nlohmann::json;

json transformers_fixture() {
  std::ifstream in(std::filesystem::path(FAB_SOURCE_DIR) / "tests/reference/rope_transformers.json");
  return json::parse(in);
}

TEST(RopeScaling, FrequenciesEqualTransformers) {
  const json doc = transformers_fixture();
  ASSERT_GE(doc["cases"].size(), 8u);
  for (const json& c : doc["cases"]) {
    const std::string name = c["name"];
    const ModelConfig config = parse_model_config(c["config"].dump(), name);
    const RopeFrequencies got = rope_frequencies(config.head_dim, config.rope_theta, config.rope_scaling);
    const std::vector<float> want = c["inv_freq"].get<std::vector<float>>();
    ASSERT_EQ(got.inv_freq.size(), want.size()) << name;
    for (size_t j = 0; j < want.size(); ++j)
      EXPECT_NEAR(got.inv_freq[j], want[j], 4e-7 * want[j]) << name << " inv_freq[" << j << "]";
    EXPECT_NEAR(got.attention_scaling, c["attention_scaling"].get<double>(), 1e-6) << name;
  }
}

std::string error_of(const std::string& config_text) {
  try {
    parse_model_config(config_text, "m/config.json");
  } catch (const UserError& e) {
    return e.what();
  }
  return "(no error)";
}

std::string with_rope(const std::string& rope) {
  return R"({"model_type": "llama", "vocab_size": 10, "hidden_size": 16, "intermediate_size": 32,
    "num_hidden_layers": 1, "num_attention_heads": 2, )" + rope + "}";
}

TEST(RopeScaling, UnsupportedFormsNameTheFileAndWhat) {
  EXPECT_NE(error_of(with_rope(R"("rope_scaling": {"rope_type": "longrope", "factor": 2})")).find(
                "m/config.json: rope_type \"longrope\" is not supported"),
            std::string::npos);
  EXPECT_NE(error_of(with_rope(R"("partial_rotary_factor": 0.5)")).find("partial_rotary_factor 0.5"),
            std::string::npos);
  EXPECT_NE(error_of(with_rope(R"("rope_scaling": {"type": "linear"})")).find("needs \"factor\""), std::string::npos);
  EXPECT_NE(error_of(with_rope(R"("rope_parameters": {"full_attention": {"rope_type": "default"}})"))
                .find("per layer type"),
            std::string::npos);
}

// transformers' dynamic NTK scaling is the default RoPE up to max_position_embeddings and changes
// per batch past it, which Fabrica does not do: longer sequences are refused.
TEST(RopeScaling, DynamicPastMaxPositionsIsRefused) {
  const ModelConfig c = parse_model_config(
      with_rope(R"("max_position_embeddings": 32, "rope_scaling": {"type": "dynamic", "factor": 2})"), "config.json");
  EXPECT_NO_THROW(DecoderModel(c, {Precision::fp32, false, 32}));
  EXPECT_THROW(DecoderModel(c, {Precision::fp32, false, 33}), UserError);
}

// The exported config.json is the source's: eos/pad ids and rope_parameters survive.
TEST(RopeScaling, ExportedConfigKeepsTheSourceKeys) {
  const std::string source = with_rope(
      R"("rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4, "original_max_position_embeddings": 64},
         "eos_token_id": 7, "pad_token_id": 3, "dtype": "bfloat16", "transformers_version": "5.6.0")");
  const json exported = json::parse(model_config_to_json(parse_model_config(source, "config.json")));
  EXPECT_EQ(exported["eos_token_id"], 7);
  EXPECT_EQ(exported["pad_token_id"], 3);
  EXPECT_EQ(exported["rope_parameters"]["rope_type"], "yarn");
  EXPECT_EQ(exported["transformers_version"], "5.6.0");
  EXPECT_EQ(exported["dtype"], "float32");  // the weights written beside it
  EXPECT_FALSE(exported.contains("rope_theta"));
  const ModelConfig again = parse_model_config(exported.dump(), "exported/config.json");
  EXPECT_EQ(again.rope_theta, 1e6);
  EXPECT_EQ(again.rope_scaling.type, "yarn");
}

}  // namespace
}  // namespace fab
