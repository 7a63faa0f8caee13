#include <gtest/gtest.h>

#include <set>

#include "train/sampler.h"

namespace fab {
namespace {

std::vector<int64_t> epoch_of(Sampler& s) {
  std::vector<int64_t> all;
  for (int64_t b = 0; b < s.batches_per_epoch(); ++b)
    for (int64_t i : s.next_batch()) all.push_back(i);
  return all;
}

TEST(Sampler, EachEpochIsASeededPermutation) {
  Sampler a(10, 3, 1, true), b(10, 3, 1, true), c(10, 3, 2, true);
  const auto e1 = epoch_of(a), e2 = epoch_of(a);
  EXPECT_EQ(std::set<int64_t>(e1.begin(), e1.end()).size(), 10u);
  EXPECT_NE(e1, e2);               // a new order each epoch
  EXPECT_EQ(epoch_of(b), e1);      // same seed, same order
  EXPECT_NE(epoch_of(c), e1);      // another seed, another order
  Sampler plain(5, 2, 1, false);
  EXPECT_EQ(epoch_of(plain), (std::vector<int64_t>{0, 1, 2, 3, 4}));
}

TEST(Sampler, RestoringTheStateContinuesExactly) {
  Sampler a(11, 2, 9, true);
  for (int i = 0; i < 8; ++i) a.next_batch();  // into the second epoch
  Sampler b(11, 2, 9, true);
  b.restore(a.state());
  for (int i = 0; i < 10; ++i) EXPECT_EQ(a.next_batch(), b.next_batch());
}

TEST(Sampler, RanksShareEachEpochWithoutOverlap) {
  Sampler r0(10, 2, 3, true, 0, 2), r1(10, 2, 3, true, 1, 2), single(10, 10, 3, true);
  const auto a = epoch_of(r0), b = epoch_of(r1), all = epoch_of(single);
  ASSERT_EQ(a.size(), 5u);
  ASSERT_EQ(b.size(), 5u);
  for (size_t i = 0; i < 5; ++i) {  // rank r takes positions r, r + 2, ... of the same order
    EXPECT_EQ(a[i], all[2 * i]);
    EXPECT_EQ(b[i], all[2 * i + 1]);
  }
  Sampler odd(5, 4, 3, false, 1, 2);  // 5 samples on 2 ranks: padded to 3 each by wrapping around
  EXPECT_EQ(epoch_of(odd), (std::vector<int64_t>{1, 3, 0}));
}

TEST(Sampler, EpochsDoneCountsTheFractionOfTheEpoch) {
  Sampler s(10, 4, 1, true);
  EXPECT_EQ(s.epochs_done(), 0.0);
  s.next_batch();  // 3 micro-batches an epoch (4, 4 and a short last one of 2), as HF counts them
  EXPECT_DOUBLE_EQ(s.epochs_done(), 1.0 / 3);
  s.next_batch(), s.next_batch();
  EXPECT_DOUBLE_EQ(s.epochs_done(), 1.0);
  s.next_batch();
  EXPECT_DOUBLE_EQ(s.epochs_done(), 1.0 + 1.0 / 3);
}

}  // namespace
}  // namespace fab
