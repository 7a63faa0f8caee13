// Supervised packing: LLaMA-Factory's greedy knapsack, packed sequences with their sample
// boundaries and boundary labels, groups, determinism, and the packed cache file.
#include "dataset/packing.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <map>

#include "config/train_config.h"
#include "core/error.h"
#include "core/rng.h"
#include "test_util.h"

namespace fab {
namespace {

// processor_utils.greedy_knapsack and the length2indexes lookup of
// PackedSupervisedDatasetProcessor, transcribed literally: a sorted list searched with bisect,
// lengths popped out of it, then each length mapped to the last unused index of that length.
std::vector<std::vector<int64_t>> llamafactory_knapsack(const std::vector<int64_t>& lengths, int64_t capacity) {
  std::map<int64_t, std::vector<int64_t>> length2indexes;
  for (size_t i = 0; i < lengths.size(); ++i) length2indexes[lengths[i]].push_back(int64_t(i));
  std::vector<int64_t> numbers = lengths;
  std::sort(numbers.begin(), numbers.end());
  std::vector<std::vector<int64_t>> knapsacks;
  while (!numbers.empty()) {
    std::vector<int64_t> knapsack;
    int64_t remaining = capacity;
    for (;;) {
      const auto index = std::upper_bound(numbers.begin(), numbers.end(), remaining) - numbers.begin();
      if (index == 0) break;
      remaining -= numbers[size_t(index - 1)];
      knapsack.push_back(numbers[size_t(index - 1)]);
      numbers.erase(numbers.begin() + index - 1);
    }
    knapsacks.push_back(knapsack);
  }
  for (auto& knapsack : knapsacks)
    for (int64_t& length : knapsack) {
      const int64_t index = length2indexes[length].back();
      length2indexes[length].pop_back();
      length = index;
    }
  return knapsacks;
}

TEST(Packing, GreedyKnapsackTakesTheLongestSampleThatFits) {
  // Sorted 1 2 3 3 5 7 8 into bins of 10: 8+2, 7+3, 5+3+1; the second 3 taken is index 1.
  const std::vector<int64_t> lengths = {5, 3, 8, 3, 2, 7, 1};
  const std::vector<std::vector<int64_t>> expected = {{2, 4}, {5, 3}, {0, 1, 6}};
  EXPECT_EQ(greedy_knapsack(lengths, 10), expected);
  EXPECT_EQ(llamafactory_knapsack(lengths, 10), expected);
}

TEST(Packing, GreedyKnapsackMatchesLlamaFactoryOnRandomLengths) {
  Rng rng(3);
  for (int trial = 0; trial < 20; ++trial) {
    const int64_t capacity = 16 + int64_t(rng.next_u64() % 200);
    std::vector<int64_t> lengths(size_t(1 + rng.next_u64() % 300));
    for (int64_t& n : lengths) n = 1 + int64_t(rng.next_u64() % uint64_t(capacity));
    ASSERT_EQ(greedy_knapsack(lengths, capacity), llamafactory_knapsack(lengths, capacity)) << "trial " << trial;
  }
}

TokenSequences samples_of(const std::vector<std::vector<int32_t>>& ids) {
  TokenSequencesBuilder b;
  for (const auto& s : ids) {
    std::vector<int32_t> labels = s;
    labels[0] = s[0] + 1000;  // a trained first token, to see the boundary masking
    b.add(s, labels);
  }
  return b.finish();
}

std::vector<int32_t> range(int32_t first, int32_t n) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) v[size_t(i)] = first + i;
  return v;
}

TEST(Packing, SequencesHoldTheSamplesInKnapsackOrderWithTheirBoundaries) {
  // Lengths 5 3 8 3 2 7 1 as above.
  const TokenSequences samples =
      samples_of({range(0, 5), range(100, 3), range(200, 8), range(300, 3), range(400, 2), range(500, 7), {600}});
  const TokenSequences packed = pack_samples(samples, {10});
  ASSERT_TRUE(packed.packed());
  ASSERT_EQ(packed.size(), 3);
  EXPECT_EQ(packed.samples(), 7);
  EXPECT_EQ(packed.total_tokens(), 29);
  EXPECT_EQ(packed.sample_starts(0), (std::vector<int64_t>{0, 8}));
  EXPECT_EQ(packed.sample_starts(1), (std::vector<int64_t>{0, 7}));
  EXPECT_EQ(packed.sample_starts(2), (std::vector<int64_t>{0, 5, 8}));
  // Sequence 1: sample 5 (500..506) then sample 3 (300..302).
  const auto tokens = packed.tokens.subspan(size_t(packed.offsets[1]), 10);
  const auto labels = packed.labels.subspan(size_t(packed.offsets[1]), 10);
  EXPECT_EQ(std::vector<int32_t>(tokens.begin(), tokens.end()),
            (std::vector<int32_t>{500, 501, 502, 503, 504, 505, 506, 300, 301, 302}));
  // Each sample keeps its labels; a sample's first label is dropped when another precedes it.
  EXPECT_EQ(std::vector<int32_t>(labels.begin(), labels.end()),
            (std::vector<int32_t>{1500, 501, 502, 503, 504, 505, 506, -100, 301, 302}));
}

TEST(Packing, LongSamplesAreDroppedEmptyOnesLeftOutAndGroupsKeptApart) {
  TokenSequencesBuilder b;
  b.add(range(0, 4), range(0, 4));
  b.add({}, {});
  b.add(range(10, 12), range(10, 12));  // longer than the capacity
  b.add(range(30, 4), range(30, 4));
  b.add(range(40, 4), range(40, 4));
  const TokenSequences samples = b.finish();
  PackingStats stats;
  const TokenSequences one_group = pack_samples(samples, {10}, &stats);
  EXPECT_EQ(stats.dropped, 1);
  EXPECT_EQ(one_group.samples(), 3);
  EXPECT_EQ(one_group.size(), 2);  // 4 + 4, then 4
  // Groups of 2 samples: {0, empty}, {long, 3}, {4}: three sequences of one sample each.
  const TokenSequences groups = pack_samples(samples, {10, 2});
  EXPECT_EQ(groups.size(), 3);
  EXPECT_EQ(groups.tokens[4], 30);
  EXPECT_EQ(groups.tokens[8], 40);
}

TEST(Packing, IsDeterministic) {
  Rng rng(9);
  std::vector<std::vector<int32_t>> ids;
  for (int i = 0; i < 500; ++i) ids.push_back(range(int32_t(i), int32_t(1 + rng.next_u64() % 60)));
  const TokenSequences samples = samples_of(ids);
  const TokenSequences a = pack_samples(samples, {64}), b = pack_samples(samples, {64});
  EXPECT_TRUE(std::ranges::equal(a.tokens, b.tokens));
  EXPECT_TRUE(std::ranges::equal(a.labels, b.labels));
  EXPECT_TRUE(std::ranges::equal(a.offsets, b.offsets));
  EXPECT_TRUE(std::ranges::equal(a.sample_offsets, b.sample_offsets));
  EXPECT_EQ(a.samples(), 500);
  for (int64_t i = 0; i < a.size(); ++i) EXPECT_LE(a.length(i), 64);
}

TEST(Packing, PackedCacheFileRoundTrips) {
  const TokenSequences packed = pack_samples(samples_of({range(0, 5), range(100, 3), range(200, 8), {7}}), {10});
  const std::string path = test::scratch_path("packed-tokens.bin");
  save_token_sequences(path, packed);
  const TokenSequences back = load_token_sequences(path);
  ASSERT_TRUE(back.packed());
  EXPECT_TRUE(std::ranges::equal(back.tokens, packed.tokens));
  EXPECT_TRUE(std::ranges::equal(back.labels, packed.labels));
  EXPECT_TRUE(std::ranges::equal(back.offsets, packed.offsets));
  EXPECT_TRUE(std::ranges::equal(back.sample_offsets, packed.sample_offsets));
  for (int64_t i = 0; i < back.size(); ++i) EXPECT_EQ(back.sample_starts(i), packed.sample_starts(i));
}

// Rewrites the int64 at `byte` of a file.
void patch(const std::string& path, size_t byte, int64_t value) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(std::streamoff(byte));
  f.write(reinterpret_cast<const char*>(&value), sizeof value);
}

TEST(Packing, DamagedPackedCacheFilesAreRejected) {
  // Sequences {8, 2} and {5} of samples 8, 2, 5: header 32 bytes, offsets 0 10 15, samples 0 8 10 15.
  const TokenSequences packed = pack_samples(samples_of({range(0, 8), range(10, 2), range(20, 5)}), {10});
  ASSERT_EQ(packed.size(), 2);
  ASSERT_EQ(packed.samples(), 3);
  const std::string path = test::scratch_path("bad-packed.bin");
  auto reject = [&](size_t byte, int64_t value, const std::string& what) {
    save_token_sequences(path, packed);
    ASSERT_NO_THROW(load_token_sequences(path));
    patch(path, byte, value);
    EXPECT_THROW(load_token_sequences(path), UserError) << what;
  };
  int64_t old_magic;
  std::memcpy(&old_magic, "FABTOK01", 8);
  reject(0, old_magic, "the previous format");
  reject(24, 4, "sample count not matching the file size");
  reject(24, int64_t(1) << 60, "absurd sample count");
  reject(32 + 3 * 8 + 8, 11, "sample starts out of order");
  reject(32 + 3 * 8 + 16, 11, "a sequence boundary that starts no sample");
  reject(32 + 3 * 8 + 24, 14, "sample offsets not ending at the token count");
}

TEST(Packing, ConfigLowersCutoffAndNeatPackingImpliesPacking) {
  TrainConfig c = parse_train_config("cutoff_len: 64\nneat_packing: true\n", "test.yaml");
  EXPECT_TRUE(c.packing);
  EXPECT_EQ(with_packing_cutoff(c).cutoff_len, 63);
  c.packing = false;
  EXPECT_EQ(with_packing_cutoff(c).cutoff_len, 64);
  EXPECT_THROW(parse_train_config("stage: pt\nneat_packing: true\n", "test.yaml"), UserError);
}

}  // namespace
}  // namespace fab
