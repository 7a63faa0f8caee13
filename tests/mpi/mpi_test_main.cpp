// The GoogleTest main of the tests that need several processes: run under mpirun (make test runs
// it at 2 and 4 ranks). Every rank runs every test in the same order, so their collectives match.
#include <cstdio>
#include <filesystem>
#include <gtest/gtest.h>

#include "comm/world.h"
#include "mpi/mpi_world.h"

namespace fab::test {

Communicator* g_world = nullptr;
Communicator& world() { return *g_world; }

std::string scratch_root() {
  return (std::filesystem::current_path() / ("mpi-scratch-" + std::to_string(world().size()))).string();
}

std::string fresh_scratch_dir(const std::string& name) {
  const std::string dir = scratch_root() + "/" + name;
  if (world().rank() == 0) {
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
  }
  world().barrier("test folder");
  return dir;
}

// On ranks other than 0 (whose report is not printed): each failed assertion or exception, with
// the rank, on stderr, so a failure on one rank alone is in the log and not only its consequence
// (the other ranks waiting in a collective until the timeout).
class FailuresOfThisRank : public ::testing::EmptyTestEventListener {
 public:
  explicit FailuresOfThisRank(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    const auto* test = ::testing::UnitTest::GetInstance()->current_test_info();
    std::fprintf(stderr, "rank %d: %s.%s failed at %s:%d: %s\n", rank_, test ? test->test_suite_name() : "?",
                 test ? test->name() : "?", r.file_name() ? r.file_name() : "?", r.line_number(), r.summary());
  }

 private:
  int rank_;
};

}  // namespace fab::test

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  fab::WorldInfo info = fab::world_from_environment();
  // A collective waits this long for a rank: only a hang should reach it, never 4 ranks sharing 2
  // loaded cores, where one rank's single-process reference may run a while.
  auto world = fab::join_world(info, 900.0);
  fab::test::g_world = world.get();
  // Only rank 0 prints the report; another rank prints its failures alone, and they fail the exit code.
  if (info.rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new fab::test::FailuresOfThisRank(info.rank));
  }
  int failed = RUN_ALL_TESTS();
  double failures = failed;
  world->all_reduce(&failures, 1, "test results").wait();
  world.reset();
  fab::leave_world();
  return failures > 0 ? 1 : 0;
}
