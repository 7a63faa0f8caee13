#include <gtest/gtest.h>

#include <fstream>

#include "core/error.h"
#include "dataset/token_sequences.h"
#include "test_util.h"

namespace fab {
namespace {

TEST(TokenSequences, CacheFileRoundTripsMemoryMapped) {
  TokenSequencesBuilder b;
  b.add({1, 2, 3}, {-100, 2, 3});
  b.add({}, {});
  b.add({7, 8}, {7, -100});
  TokenSequences data = b.finish();
  const std::string path = test::scratch_path("tokens.bin");
  save_token_sequences(path, data);
  TokenSequences back = load_token_sequences(path);
  ASSERT_EQ(back.size(), 3);
  EXPECT_EQ(back.length(0), 3);
  EXPECT_EQ(back.length(1), 0);
  EXPECT_EQ(back.tokens[4], 8);
  EXPECT_EQ(back.labels[0], -100);
  EXPECT_EQ(back.labels[4], -100);
}

TEST(TokenSequences, DamagedCacheFilesAreRejected) {
  const std::string path = test::scratch_path("bad-tokens.bin");
  std::ofstream(path) << "FABTOK01 but then nothing sensible at all";
  EXPECT_THROW(load_token_sequences(path), UserError);
  std::ofstream(path) << "x";
  EXPECT_THROW(load_token_sequences(path), UserError);
}

}  // namespace
}  // namespace fab
