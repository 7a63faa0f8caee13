// What the launcher reads out of a failed job (mpirun's report, the ranks' timeout lines), and
// which endings it restarts.
#include <gtest/gtest.h>

#include "launch/restart.h"

namespace fab {
namespace {

LaunchResult ended(int exit_code, bool stop_requested = false) {
  LaunchResult r;
  r.exit_code = exit_code;
  r.stop_requested = stop_requested;
  return r;
}

TEST(Restart, NamesTheRankMpirunSawDie) {
  LaunchResult r = ended(137);
  explain_failure("----\nmpirun noticed that process rank 1 with PID 0 on node vm exited on signal 9 (Killed).\n----\n",
                  {}, r);
  EXPECT_EQ(r.failed_rank, 1);
  EXPECT_EQ(r.cause, "rank 1 exited on signal 9 (Killed)");
}

TEST(Restart, ATimeoutNamesTheRankThatNeverCameNotTheOneThatNoticed) {
  LaunchResult r = ended(75);
  explain_failure("MPI_ABORT was invoked on rank 0 in communicator MPI_COMM_WORLD with errorcode 75.\n",
                  {"fabrica: rank 0: collective 'loss' (#40 of a group of 2) did not finish within 6 s: rank 1 never "
                   "started it (dead, hung, or stuck before this collective) (from out/logs/rank-0.log)"},
                  r);
  EXPECT_EQ(r.failed_rank, 1);
  EXPECT_EQ(r.cause.rfind("rank 0: collective 'loss'", 0), 0u) << r.cause;
  EXPECT_EQ(r.cause.find("(from "), std::string::npos) << r.cause;
}

TEST(Restart, AnAbortOrAnExitCodeIsTheCauseWhenNothingElseIs) {
  LaunchResult aborted = ended(1);
  explain_failure("MPI_ABORT was invoked on rank 3 in communicator MPI_COMM_WORLD with errorcode 1.\n", {}, aborted);
  EXPECT_EQ(aborted.failed_rank, 3);
  LaunchResult plain = ended(1);
  explain_failure("", {}, plain);
  EXPECT_EQ(plain.failed_rank, -1);
  EXPECT_EQ(plain.cause, "the workers exited with code 1");
}

TEST(Restart, OnlyFailuresARestartCanFixAreRestarted) {
  EXPECT_TRUE(worth_restarting(ended(137)));
  EXPECT_TRUE(worth_restarting(ended(75)));
  EXPECT_FALSE(worth_restarting(ended(0)));
  EXPECT_FALSE(worth_restarting(ended(2)));  // a user error: the config or the data
  EXPECT_FALSE(worth_restarting(ended(137, true)));
}

}  // namespace
}  // namespace fab
