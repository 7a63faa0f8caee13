// The rank grid: Megatron's layout for 16 ranks with tp 2, pp 2, dp 4 in the order tp-cp-dp-pp,
// coordinates, and bad sizes or orders rejected with a clear message.
#include <gtest/gtest.h>

#include "core/error.h"
#include "parallel/mesh.h"

namespace fab {
namespace {

using Groups = std::vector<std::vector<int>>;

TEST(Mesh, GroupsFollowTheOrderFastestFirst) {
  const ParallelSizes s{.tp = 2, .cp = 1, .dp = 4, .pp = 2};
  EXPECT_EQ(mesh_groups(16, s, "tp-cp-dp-pp", "tp"),
            (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}}));
  EXPECT_EQ(mesh_groups(16, s, "tp-cp-dp-pp", "dp"),
            (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}, {8, 10, 12, 14}, {9, 11, 13, 15}}));
  EXPECT_EQ(mesh_groups(16, s, "tp-cp-dp-pp", "pp"),
            (Groups{{0, 8}, {1, 9}, {2, 10}, {3, 11}, {4, 12}, {5, 13}, {6, 14}, {7, 15}}));
  EXPECT_EQ(mesh_groups(16, s, "tp-cp-dp-pp", "cp").size(), 16u);
  // dp fastest: data-parallel peers become neighbours instead.
  EXPECT_EQ(mesh_groups(16, s, "dp-tp-cp-pp", "dp")[0], (std::vector<int>{0, 1, 2, 3}));
}

TEST(Mesh, CoordinatesInvertTheLayout) {
  const ParallelSizes s{.tp = 2, .cp = 1, .dp = 4, .pp = 2};
  const auto c = mesh_coordinates(13, s, "tp-cp-dp-pp");  // 13 = 1 + 2 * (2 + 4 * 1)
  EXPECT_EQ(c.at("tp"), 1);
  EXPECT_EQ(c.at("dp"), 2);
  EXPECT_EQ(c.at("pp"), 1);
  EXPECT_EQ(c.at("cp"), 0);
}

TEST(Mesh, EveryRankIsInExactlyOneGroupPerDimension) {
  const ParallelSizes s{.tp = 2, .cp = 2, .dp = 3, .pp = 2};
  for (const char* dim : {"tp", "cp", "dp", "pp"}) {
    std::vector<int> seen(24, 0);
    for (const auto& g : mesh_groups(24, s, "tp-cp-dp-pp", dim)) {
      EXPECT_EQ(int(g.size()), s.of(dim));
      for (int r : g) ++seen[size_t(r)];
    }
    for (int count : seen) EXPECT_EQ(count, 1) << dim;
  }
}

TEST(Mesh, BadSizesAndOrdersSaySo) {
  try {
    mesh_groups(6, {.tp = 2, .cp = 1, .dp = 2, .pp = 1}, "tp-cp-dp-pp", "dp");
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("= 4 ranks, but the world has 6"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse_mesh_order("tp-dp-pp"), UserError);
  EXPECT_THROW(parse_mesh_order("tp-dp-dp-pp"), UserError);
  EXPECT_THROW(ParallelSizes{}.of("ep"), UserError);
}

}  // namespace
}  // namespace fab
