#include "monitor/tensorboard.h"

#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace fab {
namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Protocol-buffer wire format: varints, fixed 64/32-bit and length-delimited fields.
void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(char(v | 0x80));
    v >>= 7;
  }
  out.push_back(char(v));
}
void put_tag(std::string& out, int field, int wire_type) { put_varint(out, uint64_t(field << 3 | wire_type)); }
template <typename T>
void put_fixed(std::string& out, T value) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));
  out.append(bytes, sizeof(T));
}
void put_bytes(std::string& out, int field, const std::string& bytes) {
  put_tag(out, field, 2);
  put_varint(out, bytes.size());
  out += bytes;
}

std::string event_header(double wall_time, int64_t step) {
  std::string e;
  put_tag(e, 1, 1);  // double wall_time = 1
  put_fixed(e, wall_time);
  put_tag(e, 2, 0);  // int64 step = 2
  put_varint(e, uint64_t(step));
  return e;
}

uint32_t masked(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

}  // namespace

uint32_t crc32c(const void* data, size_t size) {
  static uint32_t table[256] = {};
  if (!table[1])
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = c & 1 ? 0x82f63b78u ^ (c >> 1) : c >> 1;
      table[i] = c;
    }
  uint32_t crc = 0xffffffffu;
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < size; ++i) crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return crc ^ 0xffffffffu;
}

TensorBoardWriter::TensorBoardWriter(const std::string& log_dir) {
  std::filesystem::create_directories(log_dir);
  char host[256] = "localhost";
  ::gethostname(host, sizeof host - 1);
  path_ = log_dir + "/events.out.tfevents." + std::to_string(int64_t(now_seconds())) + "." + host;
  file_ = std::make_unique<AppendFile>(path_, false);
  std::string first = event_header(now_seconds(), 0);
  put_bytes(first, 3, "brain.Event:2");  // string file_version = 3
  write_record(first);
}

void TensorBoardWriter::add_scalar(const std::string& tag, double value, int64_t step) {
  std::string v;
  put_bytes(v, 1, tag);  // Summary.Value: string tag = 1
  put_tag(v, 2, 5);      // float simple_value = 2
  put_fixed(v, float(value));
  std::string summary;
  put_bytes(summary, 1, v);  // Summary: repeated Value value = 1
  std::string e = event_header(now_seconds(), step);
  put_bytes(e, 5, summary);  // Event: Summary summary = 5
  write_record(e);
}

void TensorBoardWriter::write_record(const std::string& event) {
  std::string record;
  const uint64_t len = event.size();
  put_fixed(record, len);
  put_fixed(record, masked(crc32c(&len, 8)));
  record += event;
  put_fixed(record, masked(crc32c(event.data(), event.size())));
  file_->append(record);
}

}  // namespace fab
