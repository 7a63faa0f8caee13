// The batched rollout engine: what a request gets equals one-sequence-at-a-time decoding with the
// same KV-cache maths (the engine's reference, kept below), whichever requests share its batch;
// seeded sampling repeats; stop ids free a slot for the next prompt; bf16 decodes from the
// model's own bf16 weights.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>

#include "core/backend.h"
#include "core/error.h"
#include "core/rng.h"
#include "infer/kv_cache.h"
#include "infer/rollout.h"
#include "models/model_config.h"
#include "train/stages/rollout_stage.h"
#include "test_util.h"

namespace fab {
namespace {

constexpr int64_t kVocab = 40;

std::unique_ptr<DecoderModel> tiny_model(const char* type, Precision precision = Precision::fp32,
                                         int64_t vocab = kVocab, const LoraOptions& lora = {}) {
  ModelConfig c = parse_model_config(std::string(R"({"model_type":")") + type + R"(","vocab_size":)" +
                                         std::to_string(vocab) + R"(,
    "hidden_size":32,"intermediate_size":48,"num_hidden_layers":2,"num_attention_heads":4,
    "num_key_value_heads":2,"head_dim":16,"max_position_embeddings":64})", "test");
  DecoderOptions options{precision, false, 64};
  options.lora = lora;
  auto m = std::make_unique<DecoderModel>(c, options);
  m->init_random(11);
  return m;
}

Tensor ids_of(const std::vector<int32_t>& tokens) {
  Tensor t = Tensor::empty({1, int64_t(tokens.size())}, DType::i64, MemoryCategory::activations);
  for (size_t i = 0; i < tokens.size(); ++i) t.data<int64_t>()[i] = tokens[i];
  return t;
}

// The sequential generate() this engine replaced: one sequence, its own KvCache, the prompt in
// one forward and then one token at a time.
RolloutOutput sequential_reference(DecoderModel& model, const RolloutRequest& request, const SamplingOptions& o) {
  const int64_t vocab = model.config().vocab_size;
  KvCache cache = make_kv_cache(model, 1, int64_t(request.prompt.size()) + o.max_new_tokens);
  Rng rng(request.seed);
  Tensor logits = logits_cached(model, ids_of(request.prompt), cache);
  const float* last = logits.data<float>() + (int64_t(request.prompt.size()) - 1) * vocab;
  RolloutOutput out;
  for (int64_t step = 0; step < o.max_new_tokens; ++step) {
    const int32_t next = sample_token(last, vocab, o, rng);
    out.tokens.push_back(next);
    out.stopped = std::find(o.stop_ids.begin(), o.stop_ids.end(), next) != o.stop_ids.end();
    if (out.stopped || step + 1 == o.max_new_tokens) break;
    logits = logits_cached(model, ids_of({next}), cache);
    last = logits.data<float>();
  }
  return out;
}

// Prompts of 1 to 9 tokens, each request with its own seed.
std::vector<RolloutRequest> requests_of(size_t n, int64_t vocab = kVocab) {
  std::vector<RolloutRequest> requests;
  Rng rng(5);
  for (size_t i = 0; i < n; ++i) {
    RolloutRequest r;
    r.seed = 1000 + i;
    const size_t length = 1 + (i * 7) % 9;
    for (size_t t = 0; t < length; ++t) r.prompt.push_back(int32_t(rng.next_u64() % uint64_t(vocab)));
    requests.push_back(r);
  }
  return requests;
}

void expect_same(const std::vector<RolloutOutput>& actual, const std::vector<RolloutOutput>& expected,
                 const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (size_t i = 0; i < actual.size(); ++i) {
    EXPECT_EQ(actual[i].tokens, expected[i].tokens) << what << ", request " << i;
    EXPECT_EQ(actual[i].stopped, expected[i].stopped) << what << ", request " << i;
  }
}

std::vector<RolloutOutput> references(DecoderModel& model, const std::vector<RolloutRequest>& requests,
                                      const SamplingOptions& o) {
  std::vector<RolloutOutput> out;
  for (const RolloutRequest& r : requests) out.push_back(sequential_reference(model, r, o));
  return out;
}

class Rollout : public ::testing::TestWithParam<const char*> {};

// Slots of different lengths in one step: each span's logits are the full forward's at its last
// token (its own positions, its own keys only).
TEST_P(Rollout, SlotLogitsMatchTheFullForward) {
  auto model = tiny_model(GetParam());
  const std::vector<std::vector<int32_t>> sequences = {{3, 17, 5, 29, 8, 1, 33}, {12, 7}, {4, 9, 2, 30, 11}};
  SlotKvCache cache = make_slot_cache(*model, 3, 16);
  // Step 1: slot 0 takes 4 tokens, slot 2 one; step 2: every slot; step 3: slots 0 and 2.
  const std::vector<std::vector<std::pair<int64_t, int64_t>>> steps = {{{0, 4}, {2, 1}}, {{0, 1}, {1, 2}, {2, 2}},
                                                                       {{2, 2}, {0, 2}}};
  for (const auto& step : steps) {
    std::vector<SlotSpan> spans;
    std::vector<int32_t> tokens;
    for (const auto& [slot, count] : step) {
      const std::vector<int32_t>& seq = sequences[size_t(slot)];
      const int64_t from = cache.length[size_t(slot)];
      tokens.insert(tokens.end(), seq.begin() + from, seq.begin() + from + count);
      spans.push_back({slot, count});
    }
    const Tensor ids = ids_of(tokens).reshape({int64_t(tokens.size())});
    const Tensor logits = logits_slots(*model, ids, spans, cache);
    ASSERT_EQ(logits.numel(), int64_t(spans.size()) * kVocab);
    for (size_t s = 0; s < spans.size(); ++s) {
      const std::vector<int32_t>& seq = sequences[size_t(spans[s].slot)];
      const int64_t end = cache.length[size_t(spans[s].slot)];
      const Tensor full = model->logits(ids_of({seq.begin(), seq.begin() + end}));
      test::expect_close(logits.view(int64_t(s) * kVocab, {kVocab}), full.view((end - 1) * kVocab, {kVocab}), 1e-5,
                         "slot " + std::to_string(spans[s].slot) + " at " + std::to_string(end));
    }
  }
}

// Greedy decoding: token for token the sequential reference's, at every batch size.
TEST_P(Rollout, GreedyEqualsSequentialDecodingAtEveryBatchSize) {
  auto model = tiny_model(GetParam());
  const std::vector<RolloutRequest> requests = requests_of(11);
  SamplingOptions o;
  o.max_new_tokens = 8;
  const std::vector<RolloutOutput> expected = references(*model, requests, o);
  for (int64_t batch : {1, 3, 16})
    expect_same(rollout(*model, requests, o, batch), expected, "batch " + std::to_string(batch));
}

// Sampling: each request draws from its own stream, so the batch it shared changes nothing, and
// the same seeds give the same rollouts.
TEST_P(Rollout, SampledOutputsDependOnlyOnTheirSeed) {
  auto model = tiny_model(GetParam());
  const std::vector<RolloutRequest> requests = requests_of(9);
  SamplingOptions o;
  o.max_new_tokens = 8;
  o.temperature = 1.0;
  o.top_p = 0.9;
  o.top_k = 20;
  const std::vector<RolloutOutput> expected = references(*model, requests, o);
  for (int64_t batch : {1, 3, 8})
    expect_same(rollout(*model, requests, o, batch), expected, "batch " + std::to_string(batch));
  expect_same(rollout(*model, requests, o, 8), expected, "a second run");
  std::vector<RolloutRequest> reseeded = requests;
  for (RolloutRequest& r : reseeded) r.seed += 1;
  const std::vector<RolloutOutput> other = rollout(*model, reseeded, o, 9);
  size_t differ = 0;
  for (size_t i = 0; i < other.size(); ++i) differ += other[i].tokens != expected[i].tokens;
  EXPECT_GT(differ, other.size() / 2) << "other seeds, other rollouts";
}

INSTANTIATE_TEST_SUITE_P(Models, Rollout, ::testing::Values("llama", "qwen3"));

// A stop id ends its sequence at once (its slot goes to the next waiting prompt); the stats count
// exactly the tokens returned and the most slots that decoded together.
TEST(RolloutEngine, StopIdsEndSequencesAndTheirSlotsAreRefilled) {
  auto model = tiny_model("qwen3");
  const std::vector<RolloutRequest> requests = requests_of(9);
  SamplingOptions o;
  o.max_new_tokens = 16;
  o.temperature = 1.0;
  // Stop at the tokens the free-running rollouts emit most: most sequences end early.
  std::vector<int64_t> counts(kVocab, 0);
  for (const RolloutOutput& out : rollout(*model, requests, o, 4))
    for (int32_t t : out.tokens) ++counts[size_t(t)];
  for (int k = 0; k < 3; ++k) {
    const auto most = std::max_element(counts.begin(), counts.end());
    o.stop_ids.push_back(int32_t(most - counts.begin()));
    *most = -1;
  }
  const std::vector<RolloutOutput> expected = references(*model, requests, o);
  size_t stopped = 0;
  int64_t tokens = 0;
  for (const RolloutOutput& out : expected) {
    stopped += out.stopped;
    tokens += int64_t(out.tokens.size());
  }
  ASSERT_GE(stopped, 3u) << "the test needs sequences that stop early";
  for (int64_t batch : {1, 4, 9}) {
    RolloutStats stats;
    const std::vector<RolloutOutput> got = rollout(*model, requests, o, batch, &stats);
    expect_same(got, expected, "batch " + std::to_string(batch));
    for (const RolloutOutput& out : got) {
      ASSERT_FALSE(out.tokens.empty());
      EXPECT_EQ(out.stopped, std::find(o.stop_ids.begin(), o.stop_ids.end(), out.tokens.back()) != o.stop_ids.end());
      EXPECT_TRUE(out.stopped || int64_t(out.tokens.size()) == o.max_new_tokens);
    }
    EXPECT_EQ(stats.generated_tokens, tokens) << "batch " << batch;
    EXPECT_EQ(stats.peak_batch, std::min<int64_t>(batch, int64_t(requests.size()))) << "batch " << batch;
    EXPECT_GT(stats.seconds, 0.0);
  }
}

// The same requests twice in one call: the same outputs (the slot a request gets, and what ran
// in that slot before, do not matter).
TEST(RolloutEngine, RepeatedRequestsInOneCallAgree) {
  auto model = tiny_model("llama");
  std::vector<RolloutRequest> requests = requests_of(5);
  const std::vector<RolloutRequest> again = requests;
  requests.insert(requests.end(), again.begin(), again.end());
  SamplingOptions o;
  o.max_new_tokens = 8;
  o.temperature = 0.8;
  const std::vector<RolloutOutput> out = rollout(*model, requests, o, 3);
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(out[i].tokens, out[i + 5].tokens) << i;
}

// bf16: the engine decodes with the model's bf16 weights (the same as the bf16 full forward,
// within bf16's rounding), agrees with the sequential reference at every batch size, and
// allocates nothing near a second copy of the weights.
TEST(RolloutEngine, Bf16DecodesFromTheModelsOwnWeights) {
  auto model = tiny_model("qwen3", Precision::bf16, 2048);
  const std::vector<RolloutRequest> requests = requests_of(6, 2048);
  SamplingOptions o;
  o.max_new_tokens = 6;
  const std::vector<RolloutOutput> expected = references(*model, requests, o);
  Allocator& host = backend(DeviceKind::cpu).allocator();
  host.reset_peaks();
  const size_t before = host.total().live;
  for (int64_t batch : {1, 4})
    expect_same(rollout(*model, requests, o, batch), expected, "bf16 batch " + std::to_string(batch));
  const size_t bf16_weights = size_t(model->params().numel() + model->frozen().numel()) * 2;
  EXPECT_LT(host.total().peak - before, bf16_weights / 2) << "a rollout allocates a fraction of the weights";
  // The first token of request 0 is the argmax of the bf16 full forward.
  const Tensor full = model->logits(ids_of(requests[0].prompt));
  const float* last = full.data<float>() + (int64_t(requests[0].prompt.size()) - 1) * 2048;
  EXPECT_EQ(expected[0].tokens[0], int32_t(std::max_element(last, last + 2048) - last));
}

// Active LoRA adapters run in the engine of every thread as the base model does (their GEMMs are the
// decode GEMM too); on and off, rollouts agree with sequential decoding (which applies them too).
TEST(RolloutEngine, LoraAdaptersRunInEveryEngine) {
  LoraOptions lora;
  lora.rank = 4;
  lora.targets = {"q_proj", "v_proj", "down_proj"};
  lora.seed = 3;
  auto model = tiny_model("llama", Precision::fp32, kVocab, lora);
  const std::vector<RolloutRequest> requests = requests_of(5);
  SamplingOptions o;
  o.max_new_tokens = 6;
  o.temperature = 1.0;
  for (bool enabled : {true, false}) {
    model->set_adapters_enabled(enabled);
    EXPECT_TRUE(model->decode_concurrent());
    const std::vector<RolloutOutput> expected = references(*model, requests, o);
    for (int64_t batch : {1, 3})
      expect_same(rollout(*model, requests, o, batch), expected,
                  std::string(enabled ? "adapters on" : "adapters off") + ", batch " + std::to_string(batch));
  }
}

TEST(RolloutEngine, BadRequestsAreRefused) {
  auto model = tiny_model("llama");
  SamplingOptions o;
  o.max_new_tokens = 8;
  EXPECT_THROW(rollout(*model, {{{}, 1}}, o, 4), UserError);
  EXPECT_THROW(rollout(*model, {{{1, 2}, 1}}, o, 0), UserError);
  o.max_new_tokens = 63;
  EXPECT_THROW(rollout(*model, {{{1, 2}, 1}}, o, 4), UserError);  // 65 positions of 64
  EXPECT_TRUE(rollout(*model, {}, o, 4).empty());
}

// Top-p over a vocabulary too flat for the first sorted prefix: the nucleus is found all the same,
// and every draw lands in it.
TEST(Sampling, TopPNucleusBeyondTheFirstSortedPrefix) {
  std::vector<float> logits(1000);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = float(i % 100) * 0.01f;  // nearly flat
  SamplingOptions o;
  o.temperature = 1.0;
  o.top_p = 0.5;
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  double total = 0, cumulative = 0;
  for (float l : logits) total += std::exp(double(l) - 0.99);
  size_t nucleus = 0;
  while (cumulative < 0.5 * total) cumulative += std::exp(double(logits[size_t(order[nucleus++])]) - 0.99);
  ASSERT_GT(nucleus, 64u);
  // One more than the nucleus: its last member may differ by fp32 rounding of the weights.
  const std::vector<int32_t> kept(order.begin(), order.begin() + ptrdiff_t(nucleus) + 1);
  Rng rng(3);
  std::set<int32_t> seen;
  for (int i = 0; i < 3000; ++i) {
    const int32_t t = sample_token(logits.data(), int64_t(logits.size()), o, rng);
    EXPECT_NE(std::find(kept.begin(), kept.end(), t), kept.end()) << t;
    seen.insert(t);
  }
  EXPECT_GT(seen.size(), nucleus * 9 / 10);
}

// Issue 31: the training forward with the rollout kernels (DecoderModel::set_rollout_kernels)
// gives every response token exactly the log-probability the engine sampled it with, in fp32 and
// bf16, with LoRA adapters, for llama and qwen3 (q/k norms), across continuous batching (fewer slots
// than requests, prompts of 1 to 9 tokens, sequences ending early on a stop id); the training
// kernels do not.
TEST(RolloutEngine, TrainingForwardWithTheRolloutKernelsGivesTheEnginesLogpsExactly) {
  LoraOptions lora;
  lora.rank = 4;
  lora.alpha = 8;
  lora.targets = {"q_proj", "v_proj", "down_proj"};
  struct Case {
    const char* type;
    Precision precision;
    LoraOptions lora;
  };
  for (const Case& c : {Case{"llama", Precision::fp32, {}}, Case{"qwen3", Precision::fp32, lora},
                        Case{"qwen3", Precision::bf16, {}}}) {
    SCOPED_TRACE(std::string(c.type) + (c.precision == Precision::bf16 ? " bf16" : " fp32") +
                 (c.lora.rank ? " lora" : ""));
    auto model = tiny_model(c.type, c.precision, kVocab, c.lora);
    if (c.lora.rank) {  // adapters that change the output (B starts at zero)
      model->init_adapters();
      for (const ParamInfo& p : model->params().params())
        if (p.name.find("lora_B") != std::string::npos) {
          Tensor b = model->params().values().view(p.offset, p.shape);
          for (int64_t i = 0; i < b.numel(); ++i) b.data<float>()[i] = 0.05f * float((i % 7) - 3);
        }
      model->weights_changed();
    }
    SamplingOptions o;
    o.max_new_tokens = 10;
    o.temperature = 0.7;
    o.stop_ids = {3};
    const std::vector<RolloutRequest> requests = requests_of(7);
    const std::vector<RolloutOutput> out = rollout(*model, requests, o, 3);
    std::vector<RolloutSequence> sequences(requests.size());
    std::vector<const RolloutSequence*> rows;
    for (size_t i = 0; i < requests.size(); ++i) {
      sequences[i].prompt = requests[i].prompt;
      sequences[i].response = out[i].tokens;
      rows.push_back(&sequences[i]);
    }
    model->set_rollout_kernels(true);
    const std::vector<std::vector<double>> same = response_logps(*model, rows, 0, o.temperature);
    model->set_rollout_kernels(false);
    const std::vector<std::vector<double>> training = response_logps(*model, rows, 0, o.temperature);
    double largest = 0;
    for (size_t i = 0; i < rows.size(); ++i)
      for (size_t k = 0; k < out[i].logp.size(); ++k) {
        EXPECT_EQ(same[i][k], out[i].logp[k]) << "request " << i << " token " << k;
        largest = std::max(largest, std::fabs(training[i][k] - out[i].logp[k]));
      }
    EXPECT_GT(largest, 0.0) << "the training kernels differ in the last bits (else this test shows nothing)";
    EXPECT_LT(largest, c.precision == Precision::bf16 ? 0.1 : 1e-4);
  }
}

}  // namespace
}  // namespace fab
