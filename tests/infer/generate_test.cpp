// Generation: KV-cache logits equal the training forward's, greedy decoding follows its argmax,
// sampling honours top-k / top-p and its seed.
#include <gtest/gtest.h>

#include <set>

#include "core/rng.h"
#include "infer/generate.h"
#include "infer/kv_cache.h"
#include "models/model_config.h"
#include "test_util.h"

namespace fab {
namespace {

std::unique_ptr<DecoderModel> tiny_model(const char* type) {
  ModelConfig c = parse_model_config(std::string(R"({"model_type":")") + type + R"(","vocab_size":40,
    "hidden_size":32,"intermediate_size":48,"num_hidden_layers":2,"num_attention_heads":4,
    "num_key_value_heads":2,"head_dim":16,"max_position_embeddings":64})", "test");
  auto m = std::make_unique<DecoderModel>(c, DecoderOptions{Precision::fp32, false, 64});
  m->init_random(11);
  return m;
}

Tensor ids_of(const std::vector<int32_t>& tokens) {
  Tensor t = Tensor::empty({1, int64_t(tokens.size())}, DType::i64, MemoryCategory::activations);
  for (size_t i = 0; i < tokens.size(); ++i) t.data<int64_t>()[i] = tokens[i];
  return t;
}

class Generation : public ::testing::TestWithParam<const char*> {};

TEST_P(Generation, CachedLogitsMatchTheFullForward) {
  auto model = tiny_model(GetParam());
  const std::vector<int32_t> tokens = {3, 17, 5, 29, 8, 1, 33, 12, 7};
  Tensor full = model->logits(ids_of(tokens));
  KvCache cache = make_kv_cache(*model, 1, 16);
  Tensor first = logits_cached(*model, ids_of({tokens.begin(), tokens.begin() + 4}), cache);
  test::expect_close(first, full.view(0, {1, 4, 40}), 1e-5, "prefix logits");
  for (size_t i = 4; i < tokens.size(); ++i) {
    Tensor step = logits_cached(*model, ids_of({tokens[i]}), cache);
    test::expect_close(step, full.view(int64_t(i) * 40, {1, 1, 40}), 1e-5, "logits at " + std::to_string(i));
  }
}

TEST_P(Generation, GreedyAgreesWithTheArgmaxOfTheTrainingForward) {
  auto model = tiny_model(GetParam());
  std::vector<int32_t> sequence = {4, 9, 2};
  SamplingOptions o;
  o.max_new_tokens = 12;
  const std::vector<int32_t> generated = generate(*model, sequence, o);
  ASSERT_EQ(generated.size(), 12u);
  for (int32_t token : generated) {
    Tensor logits = model->logits(ids_of(sequence));
    const float* last = logits.data<float>() + (int64_t(sequence.size()) - 1) * 40;
    EXPECT_EQ(token, int32_t(std::max_element(last, last + 40) - last));
    sequence.push_back(token);
  }
}

INSTANTIATE_TEST_SUITE_P(Models, Generation, ::testing::Values("llama", "qwen3"));

TEST(Sampling, TopKTopPAndSeed) {
  const float logits[6] = {2.0f, 1.0f, 0.5f, 3.0f, -1.0f, 0.0f};
  SamplingOptions o;
  o.temperature = 1.0;
  o.top_k = 2;
  Rng rng(1);
  std::set<int32_t> seen;
  for (int i = 0; i < 200; ++i) seen.insert(sample_token(logits, 6, o, rng));
  EXPECT_EQ(seen, (std::set<int32_t>{0, 3}));
  o.top_k = 0;
  o.top_p = 0.5;  // p(3) = 0.57 alone reaches 0.5
  seen.clear();
  for (int i = 0; i < 200; ++i) seen.insert(sample_token(logits, 6, o, rng));
  EXPECT_EQ(seen, (std::set<int32_t>{3}));
  o.top_p = 1.0;
  Rng a(7), b(7);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(sample_token(logits, 6, o, a), sample_token(logits, 6, o, b));
}

}  // namespace
}  // namespace fab
