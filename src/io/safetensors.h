#pragma once
// safetensors: an 8-byte little-endian header length, a JSON header
// {"name": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}, then raw
// little-endian tensor bytes. The reader memory-maps the file and hands out zero-copy views;
// every header field is checked, since these files come from outside.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace fab {

struct SafetensorsEntry {
  std::string dtype;  // "F32", "BF16", "F16", "I64", "I32", ...
  Shape shape;
  size_t begin = 0, end = 0;  // byte offsets into the data section
};

class SafetensorsFile {
 public:
  static SafetensorsFile open(const std::string& path);

  const std::map<std::string, SafetensorsEntry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool contains(const std::string& name) const { return entries_.count(name) != 0; }
  std::vector<std::string> names() const;
  // A view of the mapped bytes when the stored dtype is F32/I64/I32/BF16 (zero-copy).
  Tensor tensor(const std::string& name) const;
  // The tensor converted to f32 (from F32, BF16 or F16).
  Tensor as_f32(const std::string& name, MemoryCategory category = MemoryCategory::temporaries) const;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::shared_ptr<void> mapping_;  // unmaps when the file and every view are gone
  const char* data_ = nullptr;     // start of the data section
  std::map<std::string, SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

// Parses and validates a header (exposed for the fuzz target and tests).
void parse_safetensors_header(const std::string& json_text, size_t data_bytes, const std::string& source,
                              std::map<std::string, SafetensorsEntry>& entries,
                              std::map<std::string, std::string>& metadata);

struct NamedTensor {
  std::string name;
  Tensor tensor;
};
// Writes atomically: a temporary file in the same folder, fsync, rename.
void save_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

}  // namespace fab
