#include <gtest/gtest.h>

#include "core/error.h"
#include "models/decoder.h"
#include "models/model_config.h"

namespace fab {
namespace {

const char* kQwen3 = R"({"model_type": "qwen3", "vocab_size": 100, "hidden_size": 64, "intermediate_size": 96,
  "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
  "rms_norm_eps": 1e-6, "rope_theta": 1000000, "tie_word_embeddings": true})";

TEST(ModelConfig, ReadsQwen3WithExplicitHeadDim) {
  ModelConfig c = parse_model_config(kQwen3, "config.json");
  EXPECT_EQ(c.head_dim, 32);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_TRUE(c.tie_word_embeddings);
  DecoderModel model(c, {Precision::fp32, false, 16});
  EXPECT_EQ(model.params().info("model.layers.1.self_attn.q_proj.weight").shape, (Shape{128, 64}));
  EXPECT_EQ(model.params().info("model.layers.0.self_attn.k_norm.weight").shape, (Shape{32}));
  EXPECT_FALSE(model.params().contains("lm_head.weight"));
  int64_t total = 0;
  for (const ParamInfo& p : model.params().params()) total += p.numel();
  EXPECT_EQ(total, c.num_parameters());
}

TEST(ModelConfig, Qwen2AlwaysHasQkvBiases) {
  ModelConfig c = parse_model_config(
      R"({"model_type":"qwen2","vocab_size":10,"hidden_size":8,"intermediate_size":16,"num_hidden_layers":1,
          "num_attention_heads":2})",
      "config.json");
  EXPECT_TRUE(c.attention_bias);
  EXPECT_EQ(c.num_key_value_heads, 2);
  EXPECT_EQ(c.head_dim, 4);
}

TEST(ModelConfig, BadConfigsNameTheFileAndField) {
  auto message = [](const std::string& text) {
    try {
      parse_model_config(text, "my/config.json");
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(message(R"({"model_type":"gpt2"})").find("model_type \"gpt2\" is not supported"), std::string::npos);
  EXPECT_NE(message(R"({"model_type":"llama"})").find("my/config.json: missing field \"vocab_size\""),
            std::string::npos);
  EXPECT_NE(message(R"({"model_type":"llama","vocab_size":"big"})").find("\"vocab_size\" has the wrong type"),
            std::string::npos);
  EXPECT_NE(message(R"({"model_type":"llama","vocab_size":10,"hidden_size":8,"intermediate_size":16,
      "num_hidden_layers":1,"num_attention_heads":3,"num_key_value_heads":2})")
                .find("not a multiple"),
            std::string::npos);
  EXPECT_NE(message("{").find("not valid JSON"), std::string::npos);
}

}  // namespace
}  // namespace fab
