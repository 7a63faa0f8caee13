#pragma once
// One run per output_dir: an exclusive flock on output_dir/.fabrica.lock, held by the launcher (or,
// without one, by rank 0) for the whole run. The file names its holder (pid and host), so a second
// run on the same output_dir fails at once with a UserError saying who holds it. The lock dies with
// the holder's process, however it ends; a clean release also removes the file, and output_dir
// itself when the lock created it and nothing else was written there.
#include <string>

namespace fab {

class OutputDirLock {
 public:
  explicit OutputDirLock(const std::string& output_dir);
  ~OutputDirLock();
  OutputDirLock(const OutputDirLock&) = delete;
  OutputDirLock& operator=(const OutputDirLock&) = delete;

  const std::string& path() const { return lock_path_; }

  // Set in the environment of the workers the launcher starts: they run under its lock.
  static constexpr const char* kHeldByLauncher = "FABRICA_OUTPUT_DIR_LOCK";
  // True when this process's launcher holds the lock of `output_dir`.
  static bool held_by_launcher(const std::string& output_dir);

 private:
  std::string lock_path_, output_dir_, first_created_;
  int fd_ = -1;
};

}  // namespace fab
