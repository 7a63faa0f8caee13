// Batches: right padding, and for packed data each token's position inside its sample and, with
// the document mask, its sample's first index.
#include "train/batch.h"

#include <gtest/gtest.h>

#include "dataset/packing.h"

namespace fab {
namespace {

std::vector<int64_t> row(const Tensor& t, int64_t r) {
  std::vector<int64_t> out;
  for (int64_t i = 0; i < t.dim(1); ++i)
    out.push_back(t.dtype() == DType::i32 ? t.data<int32_t>()[r * t.dim(1) + i] : t.data<int64_t>()[r * t.dim(1) + i]);
  return out;
}

TEST(Batch, UnpackedRowsArePaddedAndCarryNoLayout) {
  TokenSequencesBuilder b;
  b.add({1, 2, 3}, {-100, 2, 3});
  b.add({4}, {4});
  const Batch batch = collate(b.finish(), {1, 0}, 9, true);
  EXPECT_EQ(row(batch.ids, 0), (std::vector<int64_t>{4, 9, 9}));
  EXPECT_EQ(row(batch.labels, 0), (std::vector<int64_t>{4, -100, -100}));
  EXPECT_EQ(row(batch.ids, 1), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(batch.tokens, 4);
  EXPECT_FALSE(batch.positions.defined());
  EXPECT_FALSE(batch.doc_start.defined());
}

TEST(Batch, PackedRowsRestartPositionsInEverySample) {
  TokenSequencesBuilder b;
  b.add({1, 2, 3, 4}, {1, 2, 3, 4});
  b.add({5, 6}, {5, 6});
  b.add({7, 8, 9}, {7, 8, 9});
  const TokenSequences packed = pack_samples(b.finish(), {6});  // 4 + 2 | 3
  const Batch neat = collate(packed, {0, 1}, 0, true);
  EXPECT_EQ(row(neat.ids, 0), (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(row(neat.labels, 0), (std::vector<int64_t>{1, 2, 3, 4, -100, 6}));
  EXPECT_EQ(row(neat.positions, 0), (std::vector<int64_t>{0, 1, 2, 3, 0, 1}));
  EXPECT_EQ(row(neat.doc_start, 0), (std::vector<int64_t>{0, 0, 0, 0, 4, 4}));
  EXPECT_EQ(row(neat.positions, 1), (std::vector<int64_t>{0, 1, 2, 0, 1, 2}));  // padding: its own sample
  EXPECT_EQ(row(neat.doc_start, 1), (std::vector<int64_t>{0, 0, 0, 3, 3, 3}));
  EXPECT_EQ(row(neat.labels, 1), (std::vector<int64_t>{7, 8, 9, -100, -100, -100}));
  const Batch plain = collate(packed, {0, 1}, 0, false);
  EXPECT_EQ(row(plain.positions, 0), row(neat.positions, 0));
  EXPECT_FALSE(plain.doc_start.defined());
}

}  // namespace
}  // namespace fab
