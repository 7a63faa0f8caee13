#pragma once
// TensorBoard event files (events.out.tfevents.<time>.<host>) with scalar summaries, written
// directly: TFRecord framing (length, masked CRC-32C, Event protobuf, masked CRC-32C) around a
// hand-encoded Event { wall_time, step, file_version | summary { value { tag, simple_value } } }.
#include <memory>
#include <string>

#include "core/file_write.h"

namespace fab {

class TensorBoardWriter {
 public:
  explicit TensorBoardWriter(const std::string& log_dir);
  void add_scalar(const std::string& tag, double value, int64_t step);
  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& event);
  std::string path_;
  std::unique_ptr<AppendFile> file_;
};

uint32_t crc32c(const void* data, size_t size);

}  // namespace fab
