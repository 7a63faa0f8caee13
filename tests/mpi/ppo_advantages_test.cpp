// stage ppo whitens the GAE advantages over every response token of the step on every rank, as
// verl whitens its whole batch: the responses split over the ranks get the advantages and returns
// that one process holding all of them computes.
#include <gtest/gtest.h>

#include <vector>

#include "comm/communicator.h"
#include "mpi/mpi_world.h"
#include "train/stages/ppo_stage.h"

namespace fab {
namespace {

// Response i: 1 + i % 4 tokens, its own reward and values (rank-independent numbers).
RolloutSequence response(int i) {
  RolloutSequence r;
  const int n = 1 + i % 4;
  for (int k = 0; k < n; ++k) {
    r.response.push_back(k + 3);
    r.values.push_back(0.1 * double((i * 7 + k * 3) % 11) - 0.4);
  }
  r.reward = double((i * 5) % 3) - 0.5;
  return r;
}

TEST(PpoAdvantages, WhitenedOverEveryRankAsOverOneBatch) {
  Communicator& w = test::world();
  TrainConfig c;
  c.gamma = 0.99;
  c.lam = 0.95;
  const int per_rank = 3, total = per_rank * w.size();
  std::vector<RolloutSequence> all, mine;
  for (int i = 0; i < total; ++i) {
    all.push_back(response(i));
    if (i / per_rank == w.rank()) mine.push_back(response(i));
  }
  LocalCommunicator one;
  set_advantages(all, c, one);
  set_advantages(mine, c, w);
  for (int j = 0; j < per_rank; ++j) {
    const RolloutSequence& want = all[size_t(w.rank() * per_rank + j)];
    ASSERT_EQ(mine[size_t(j)].token_advantages.size(), want.token_advantages.size());
    for (size_t k = 0; k < want.token_advantages.size(); ++k) {
      EXPECT_NEAR(mine[size_t(j)].token_advantages[k], want.token_advantages[k], 1e-12) << "response " << j;
      EXPECT_NEAR(mine[size_t(j)].returns[k], want.returns[k], 1e-12) << "response " << j;
    }
  }
}

}  // namespace
}  // namespace fab
