// What neat_packing promises: a batch of packed rows (document mask, positions restarting in each
// sample) gives the loss and every gradient that the same samples give run one by one.
#include <gtest/gtest.h>

#include "core/rng.h"
#include "dataset/packing.h"
#include "models/decoder.h"
#include "test_util.h"
#include "train/batch.h"

namespace fab {
namespace {

constexpr int64_t kVocab = 50;

// qwen3: GQA, q/k norms, head_dim 8 (the padded attention path), tied embeddings.
ModelConfig tiny_config() {
  return parse_model_config(R"({"model_type": "qwen3", "vocab_size": 50, "hidden_size": 32,
    "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 8, "max_position_embeddings": 256, "tie_word_embeddings": true, "initializer_range": 0.2})",
                            "tiny");
}

// Samples of the given lengths, the first few tokens of each masked as prompt.
TokenSequences samples(const std::vector<int64_t>& lengths, uint64_t seed) {
  Rng rng(seed);
  TokenSequencesBuilder b;
  for (int64_t n : lengths) {
    std::vector<int32_t> ids, labels;
    for (int64_t t = 0; t < n; ++t) {
      ids.push_back(int32_t(rng.next_u64() % kVocab));
      labels.push_back(t < n / 4 ? -100 : ids.back());
    }
    b.add(ids, labels);
  }
  return b.finish();
}

struct Result {
  double loss = 0;
  int64_t targets = 0;
  Tensor grads;
};

// Every sample alone, as a batch of one row; the gradient of sum(losses) / targets.
Result unpacked(DecoderModel& model, const TokenSequences& data) {
  Result r;
  std::vector<Batch> batches;
  for (int64_t i = 0; i < data.size(); ++i) {
    batches.push_back(collate(data, {i}, 0));
    r.targets += DecoderModel::count_targets(batches.back().labels);
  }
  model.params().grads().zero_();
  for (const Batch& b : batches) r.loss += model.forward_backward(b.ids, b.labels, 1.0f / float(r.targets));
  r.grads = model.params().grads().clone(MemoryCategory::activations);
  return r;
}

// All packed sequences in one batch.
Result packed(DecoderModel& model, const TokenSequences& data, bool document_mask) {
  std::vector<int64_t> all;
  for (int64_t i = 0; i < data.size(); ++i) all.push_back(i);
  const Batch b = collate(data, all, 0, document_mask);
  Result r;
  r.targets = DecoderModel::count_targets(b.labels);
  model.params().grads().zero_();
  r.loss = model.forward_backward(b.ids, b.labels, 1.0f / float(r.targets), {b.positions, b.doc_start});
  r.grads = model.params().grads().clone(MemoryCategory::activations);
  return r;
}

class PackedDecoder : public ::testing::TestWithParam<bool> {};  // recompute_layers

TEST_P(PackedDecoder, NeatPackedBatchEqualsTheSamplesRunAlone) {
  DecoderOptions options;
  options.recompute_layers = GetParam();
  options.max_seq_len = 128;
  DecoderModel model(tiny_config(), options);
  model.init_random(7);
  // Packed into 120 tokens: 70 + 50 | 45 + 30 + 9 + 1 (+ padding to 120): documents across the
  // 64-token attention tiles, a one-token sample, a padded row.
  const TokenSequences data = samples({30, 50, 45, 70, 9, 1}, 3);
  const TokenSequences packs = pack_samples(data, {120});
  ASSERT_EQ(packs.size(), 2);
  ASSERT_EQ(packs.length(1), 85);

  const Result alone = unpacked(model, data), neat = packed(model, packs, true);
  EXPECT_EQ(neat.targets, alone.targets);
  EXPECT_NEAR(neat.loss, alone.loss, 1e-5 * alone.loss);
  for (const ParamInfo& p : model.params().params())
    test::expect_close(neat.grads.view(p.offset, p.shape), alone.grads.view(p.offset, p.shape), 1e-4,
                       "grad of " + p.name);

  // Plain packing lets attention cross samples: a different loss (the positions still restart).
  const Result plain = packed(model, packs, false);
  EXPECT_EQ(plain.targets, alone.targets);
  EXPECT_GT(std::fabs(plain.loss - alone.loss), 1e-3 * alone.loss);
}

INSTANTIATE_TEST_SUITE_P(Recompute, PackedDecoder, ::testing::Values(false, true));

}  // namespace
}  // namespace fab
