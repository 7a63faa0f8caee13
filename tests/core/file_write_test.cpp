// Checked writes: complete files or a UserError with the system's reason, on a disk that is full
// (a 64 KiB tmpfs, mounted for the test; skipped only where mounting is not allowed) and on
// /dev/full.
#include <gtest/gtest.h>
#include <sys/mount.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/file_write.h"
#include "monitor/metrics_log.h"
#include "test_util.h"

namespace fab {
namespace {
namespace fs = std::filesystem;

using test::fresh_dir;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// A 64 KiB tmpfs mounted on a fresh folder for as long as it lives.
class FullDisk {
 public:
  explicit FullDisk(const std::string& name) : dir_(fresh_dir(name)) {
    mounted_ = ::mount("tmpfs", dir_.c_str(), "tmpfs", 0, "size=64k") == 0;
  }
  ~FullDisk() {
    if (mounted_) ::umount2(dir_.c_str(), MNT_DETACH);
  }
  bool mounted() const { return mounted_; }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  bool mounted_ = false;
};

// The UserError `write` throws; "" when it throws none.
template <typename Write>
std::string write_error(Write write) {
  try {
    write();
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  return names;
}

TEST(FileWrite, AtomicWriteReplacesTheFileAndLeavesNoTemporary) {
  const std::string dir = fresh_dir("replace"), path = dir + "/config.json";
  write_file_atomically(path, "old\n");
  write_file_atomically(path, "new\n");
  EXPECT_EQ(read_file(path), "new\n");
  EXPECT_EQ(files_in(dir), std::vector<std::string>{"config.json"});
}

TEST(FileWrite, FullDiskIsAUserErrorAndKeepsTheOldFile) {
  FullDisk disk("full-atomic");
  if (!disk.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here [needs: root]";
  const std::string path = disk.dir() + "/config.json";
  write_file_atomically(path, "old\n");
  const std::string error = write_error([&] { write_file_atomically(path, std::string(256 << 10, 'x')); });
  EXPECT_NE(error.find(path), std::string::npos) << error;
  EXPECT_NE(error.find("No space left on device"), std::string::npos) << error;
  EXPECT_EQ(read_file(path), "old\n");
  EXPECT_EQ(files_in(disk.dir()), std::vector<std::string>{"config.json"});
}

TEST(FileWrite, FailedAppendIsAUserErrorAndLeavesOnlyWholeLines) {
  EXPECT_NE(write_error([] { AppendFile("/dev/full", true).append_line("{\"step\": 1}"); })
                .find("/dev/full: cannot write (No space left on device)"),
            std::string::npos);
  FullDisk disk("full-append");
  if (!disk.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here [needs: root]";
  const std::string path = disk.dir() + "/metrics.jsonl";
  AppendFile file(path, false);
  file.append_line("{\"step\": 1}");
  const std::string error = write_error([&] { file.append_line(std::string(256 << 10, 'x')); });
  EXPECT_NE(error.find("No space left on device"), std::string::npos) << error;
  EXPECT_EQ(read_file(path), "{\"step\": 1}\n");
}

TEST(FileWrite, MetricsLogStopsOnAFullDisk) {
  FullDisk disk("full-metrics");
  if (!disk.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here [needs: root]";
  MetricsLog log(disk.dir(), false);
  std::string error;
  for (int step = 0; step < 10000 && error.empty(); ++step)
    error = write_error([&] { log.write("{\"step\": " + std::to_string(step) + ", \"loss\": 1.0}"); });
  EXPECT_NE(error.find(disk.dir() + "/metrics.jsonl: cannot write (No space left on device)"), std::string::npos)
      << error;
  std::ifstream in(disk.dir() + "/metrics.jsonl");
  for (std::string line; std::getline(in, line);) EXPECT_EQ(line.back(), '}') << "a cut line: " << line;
}

}  // namespace
}  // namespace fab
