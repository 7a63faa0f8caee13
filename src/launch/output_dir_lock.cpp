#include "launch/output_dir_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.h"

namespace fab {
namespace fs = std::filesystem;

namespace {

std::string lock_path_of(const std::string& output_dir) {
  return (fs::weakly_canonical(fs::absolute(output_dir)) / ".fabrica.lock").string();
}

// The outermost folder of `path` that does not exist yet ("" when it exists).
std::string first_missing_folder(const std::string& path) {
  fs::path first = fs::absolute(path);
  if (fs::exists(first)) return "";
  while (first.has_parent_path() && first != first.parent_path() && !fs::exists(first.parent_path()))
    first = first.parent_path();
  return first.string();
}

std::string holder_of(const std::string& lock_path) {
  std::ifstream in(lock_path);
  std::string holder;
  std::getline(in, holder);
  return holder.empty() ? "a process that has not written its pid yet" : holder;
}

std::string this_process() {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  return format("pid {} on host {}", ::getpid(), host);
}

// The file at `path` is still the one `fd` locked (a releasing holder unlinks it first).
bool still_linked(int fd, const std::string& path) {
  struct stat held {}, named {};
  return ::fstat(fd, &held) == 0 && ::stat(path.c_str(), &named) == 0 && held.st_ino == named.st_ino &&
         held.st_dev == named.st_dev;
}

// Removes output_dir and the folders above it that the lock created, as long as they are empty.
void remove_empty_created_folders(fs::path dir, const fs::path& first_created) {
  std::error_code error;
  while (!first_created.empty() && fs::is_empty(dir, error) && fs::remove(dir, error) && dir != first_created)
    dir = dir.parent_path();
}

}  // namespace

OutputDirLock::OutputDirLock(const std::string& output_dir)
    : output_dir_(fs::absolute(output_dir).string()), first_created_(first_missing_folder(output_dir)) {
  std::error_code error;
  fs::create_directories(output_dir, error);
  FAB_USER_CHECK(!error, "output_dir {} cannot be created ({})", output_dir, error.message());
  lock_path_ = lock_path_of(output_dir);
  // Not close-on-exec: mpirun inherits it, so the lock lives as long as the job.
  for (;;) {
    fd_ = ::open(lock_path_.c_str(), O_RDWR | O_CREAT, 0644);
    FAB_USER_CHECK(fd_ >= 0, "{}: cannot open the output_dir lock ({})", lock_path_, std::strerror(errno));
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      const std::string why = errno == EWOULDBLOCK ? "" : format(" ({})", std::strerror(errno));
      ::close(fd_);
      fd_ = -1;
      throw UserError(format("output_dir {} is in use by another fabrica run ({}; lock file {}){}: wait for it to "
                             "end or choose another output_dir",
                             output_dir, holder_of(lock_path_), lock_path_, why));
    }
    if (still_linked(fd_, lock_path_)) break;
    ::close(fd_);
  }
  const std::string holder = this_process() + "\n";
  FAB_USER_CHECK(::ftruncate(fd_, 0) == 0 && ::pwrite(fd_, holder.data(), holder.size(), 0) == ssize_t(holder.size()),
                 "{}: cannot write the output_dir lock ({})", lock_path_, std::strerror(errno));
}

OutputDirLock::~OutputDirLock() {
  ::unlink(lock_path_.c_str());
  ::close(fd_);
  remove_empty_created_folders(output_dir_, first_created_);
}

bool OutputDirLock::held_by_launcher(const std::string& output_dir) {
  const char* held = std::getenv(kHeldByLauncher);
  return held && held == lock_path_of(output_dir);
}

}  // namespace fab
