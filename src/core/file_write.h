#pragma once
// Checked file writes. Every file Fabrica writes goes through these: each write, the flush, the
// fsync and the rename are checked, and a failure is a UserError naming the path with the system's
// reason ("No space left on device"), never a silent short file.
#include <string>
#include <string_view>

namespace fab {

// A whole file written atomically: a temporary file in the same folder, fsync, rename over `path`,
// fsync of the folder. Readers see the old file or the complete new one. Without commit() (an
// error, an exception elsewhere) the temporary file is removed and `path` is left as it was.
class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(std::string path);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  void write(const void* data, size_t bytes);
  void write(std::string_view text) { write(text.data(), text.size()); }
  void commit();

 private:
  std::string path_, tmp_;
  int fd_ = -1;
};

// Where Fabrica keeps what it derives and reuses (tokenized data, the machine's measured peak):
// $FABRICA_CACHE, else ~/.cache/fabrica.
std::string fabrica_cache_dir();

// AtomicFileWriter for a file given whole.
void write_file_atomically(const std::string& path, std::string_view content);

// `from`'s bytes written atomically to `to` (tokenizer files beside exported weights).
void copy_file_atomically(const std::string& from, const std::string& to);

// A file that grows by appends (metrics.jsonl, TensorBoard events). Each append is written whole
// or not at all: after a failed write the file is cut back to where it was, then the UserError.
class AppendFile {
 public:
  AppendFile(const std::string& path, bool keep_existing);
  ~AppendFile();
  AppendFile(const AppendFile&) = delete;
  AppendFile& operator=(const AppendFile&) = delete;

  void append(std::string_view bytes);
  void append_line(std::string_view line);

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace fab
