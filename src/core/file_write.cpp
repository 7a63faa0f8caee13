#include "core/file_write.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace fab {
namespace {

std::string reason() { return std::strerror(errno); }

// Writes all of `bytes` to `fd`, retrying short writes and EINTR; false with errno set on failure.
bool write_all(int fd, const char* data, size_t bytes) {
  while (bytes > 0) {
    const ssize_t n = ::write(fd, data, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return false;
    if (n == 0) {
      errno = EIO;
      return false;
    }
    data += n;
    bytes -= size_t(n);
  }
  return true;
}

// A name no other writer (thread or process) of the same file uses at the same time.
std::string temporary_name(const std::string& path) {
  static std::atomic<uint64_t> counter{0};
  return path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
}

void fsync_folder_of(const std::string& path) {
  std::filesystem::path folder = std::filesystem::path(path).parent_path();
  if (folder.empty()) folder = ".";
  const int fd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;  // the file itself is synced; a folder we cannot open has nothing to add
  ::fsync(fd);
  ::close(fd);
}

// Best effort: ftruncate fails only where nothing is kept to cut back (a pipe, /dev/full).
void cut_back(int fd, off_t size) {
  const int ignored = ::ftruncate(fd, size);
  (void)ignored;
}

}  // namespace

AtomicFileWriter::AtomicFileWriter(std::string path) : path_(std::move(path)), tmp_(temporary_name(path_)) {
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  FAB_USER_CHECK(fd_ >= 0, "{}: cannot write ({})", path_, reason());
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ < 0) return;
  ::close(fd_);
  ::unlink(tmp_.c_str());
}

void AtomicFileWriter::write(const void* data, size_t bytes) {
  FAB_CHECK(fd_ >= 0, "{}: AtomicFileWriter used after commit", path_);
  FAB_USER_CHECK(write_all(fd_, static_cast<const char*>(data), bytes), "{}: cannot write ({})", path_, reason());
}

void AtomicFileWriter::commit() {
  FAB_CHECK(fd_ >= 0, "{}: AtomicFileWriter committed twice", path_);
  FAB_USER_CHECK(::fsync(fd_) == 0, "{}: cannot write ({})", path_, reason());
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) {
    const std::string why = reason();
    ::unlink(tmp_.c_str());
    throw UserError(format("{}: cannot write ({})", path_, why));
  }
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const std::string why = reason();
    ::unlink(tmp_.c_str());
    throw UserError(format("{}: cannot rename into place ({})", path_, why));
  }
  fsync_folder_of(path_);
}

void write_file_atomically(const std::string& path, std::string_view content) {
  AtomicFileWriter out(path);
  out.write(content);
  out.commit();
}

void copy_file_atomically(const std::string& from, const std::string& to) {
  std::ifstream in(from, std::ios::binary);
  FAB_USER_CHECK(in, "{}: cannot open ({})", from, reason());
  std::ostringstream bytes;
  bytes << in.rdbuf();
  FAB_USER_CHECK(!in.bad(), "{}: cannot read ({})", from, reason());
  write_file_atomically(to, bytes.str());
}

AppendFile::AppendFile(const std::string& path, bool keep_existing) : path_(path) {
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | (keep_existing ? 0 : O_TRUNC), 0666);
  FAB_USER_CHECK(fd_ >= 0, "{}: cannot open for writing ({})", path, reason());
}

AppendFile::~AppendFile() {
  if (fd_ >= 0) ::close(fd_);
}

void AppendFile::append(std::string_view bytes) {
  const off_t before = ::lseek(fd_, 0, SEEK_END);
  if (write_all(fd_, bytes.data(), bytes.size())) return;
  const std::string why = reason();
  if (before >= 0) cut_back(fd_, before);
  throw UserError(format("{}: cannot write ({})", path_, why));
}

void AppendFile::append_line(std::string_view line) {
  std::string text(line);
  text += '\n';
  append(text);
}

std::string fabrica_cache_dir() {
  if (const char* dir = std::getenv("FABRICA_CACHE")) return dir;
  const char* home = std::getenv("HOME");
  return std::string(home ? home : "/tmp") + "/.cache/fabrica";
}

}  // namespace fab
