#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "io/checkpoint_names.h"
#include "test_util.h"

namespace fab {
namespace {
namespace fs = std::filesystem;

TEST(CheckpointNames, StepIsReadOnlyFromCheckpointDigits) {
  EXPECT_EQ(checkpoint_name(500), "checkpoint-500");
  EXPECT_EQ(checkpoint_step("out/checkpoint-12"), 12);
  EXPECT_EQ(checkpoint_step(checkpoint_name(7)), 7);
  for (const char* other : {"out/checkpoint-3.tmp", "out/checkpoint-", "out/checkpoint-x1", "out/logs", "checkpoint"})
    EXPECT_EQ(checkpoint_step(other), -1) << other;
}

TEST(CheckpointNames, LatestIsTheLargestStepNeverATmpFolderAndPruningKeepsTheNewest) {
  const std::string out = test::fresh_dir("checkpoint-names");
  EXPECT_EQ(latest_checkpoint(out + "/missing"), "");
  EXPECT_EQ(latest_checkpoint(out), "");
  for (const char* name : {"checkpoint-9", "checkpoint-10", "checkpoint-2", "checkpoint-11.tmp", "logs"})
    fs::create_directories(fs::path(out) / name);
  std::ofstream(fs::path(out) / "checkpoint-12") << "a file, not a folder";
  EXPECT_EQ(latest_checkpoint(out), out + "/checkpoint-10");  // 10 > 9 by number, not by text
  EXPECT_EQ(checkpoints_by_step(out), (std::vector<std::string>{out + "/checkpoint-2", out + "/checkpoint-9",
                                                                 out + "/checkpoint-10"}));
  prune_checkpoints(out, 0);  // save_total_limit 0 keeps all
  EXPECT_EQ(checkpoints_by_step(out).size(), 3u);
  prune_checkpoints(out, 2);
  EXPECT_EQ(checkpoints_by_step(out), (std::vector<std::string>{out + "/checkpoint-9", out + "/checkpoint-10"}));
  EXPECT_TRUE(fs::exists(fs::path(out) / "checkpoint-11.tmp"));
}

TEST(CheckpointNames, ResumeReadsTheFlagOrTheFolderAndRefusesWhatIsNotThere) {
  const std::string out = test::fresh_dir("checkpoint-resume");
  EXPECT_EQ(checkpoint_to_resume("", out), "");
  EXPECT_EQ(checkpoint_to_resume("False", out), "");
  EXPECT_THROW(checkpoint_to_resume("yes", out), UserError);  // true, and no checkpoint yet
  EXPECT_THROW(checkpoint_to_resume(out + "/checkpoint-4", out), UserError);
  fs::create_directories(fs::path(out) / "checkpoint-4");
  std::ofstream(fs::path(out) / "checkpoint-4" / "trainer_state.json") << R"({"global_step": 4})";
  EXPECT_EQ(checkpoint_to_resume("true", out), out + "/checkpoint-4");
  EXPECT_EQ(checkpoint_to_resume(out + "/checkpoint-4", out), out + "/checkpoint-4");
  std::ofstream(fs::path(out) / "checkpoint-4" / "trainer_state.json") << R"({"save_only_model": true})";
  EXPECT_THROW(checkpoint_to_resume("true", out), UserError);
}

}  // namespace
}  // namespace fab
