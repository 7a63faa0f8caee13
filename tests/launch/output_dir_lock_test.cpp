// One run per output_dir: a second lock on the same folder fails at once naming the holder; the
// lock is released with its holder, and a released lock leaves nothing behind.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "core/error.h"
#include "launch/output_dir_lock.h"
#include "test_util.h"

namespace fab {
namespace {
namespace fs = std::filesystem;

// A path in this process's scratch folder with nothing there yet.
std::string fresh_dir(const std::string& name) {
  const std::string dir = test::scratch_path(name);
  fs::remove_all(dir);
  return dir;
}

TEST(OutputDirLock, ASecondRunFailsNamingTheHolder) {
  const std::string dir = fresh_dir("second");
  const OutputDirLock held(dir);
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  try {
    const OutputDirLock second(dir);
    FAIL() << "a second lock on " << dir << " was granted";
  } catch (const UserError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("is in use by another fabrica run (pid " + std::to_string(::getpid()) + " on host " + host),
              std::string::npos)
        << message;
  }
}

TEST(OutputDirLock, ReleasedLockCanBeTakenAgainAndLeavesNothing) {
  const std::string dir = fresh_dir("release");
  { const OutputDirLock first(dir); }
  EXPECT_FALSE(fs::exists(dir)) << "the folder the lock created, still empty, is removed";
  fs::create_directories(dir);
  {
    const OutputDirLock again(dir);
    EXPECT_TRUE(fs::exists(again.path()));
  }
  EXPECT_TRUE(fs::exists(dir)) << "a folder that was there before stays";
  EXPECT_TRUE(fs::is_empty(dir));
}

TEST(OutputDirLock, WorkersKnowTheirLauncherHoldsIt) {
  const std::string dir = fresh_dir("launcher");
  const OutputDirLock lock(dir);
  EXPECT_FALSE(OutputDirLock::held_by_launcher(dir));
  ::setenv(OutputDirLock::kHeldByLauncher, lock.path().c_str(), 1);
  EXPECT_TRUE(OutputDirLock::held_by_launcher(dir));
  EXPECT_FALSE(OutputDirLock::held_by_launcher(fresh_dir("other")));
  ::unsetenv(OutputDirLock::kHeldByLauncher);
}

}  // namespace
}  // namespace fab
