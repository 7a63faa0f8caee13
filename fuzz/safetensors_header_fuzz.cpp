// libFuzzer target for the safetensors header parser: `make fuzz` (clang, ASan + UBSan).
// Input: 8 bytes of "data size" followed by the header text.
#include <cstdint>
#include <cstring>
#include <map>
#include <string>

#include "core/error.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 8) return 0;
  uint64_t data_bytes;
  std::memcpy(&data_bytes, data, 8);
  std::map<std::string, fab::SafetensorsEntry> entries;
  std::map<std::string, std::string> metadata;
  try {
    fab::parse_safetensors_header(std::string(reinterpret_cast<const char*>(data) + 8, size - 8), data_bytes,
                                  "fuzz", entries, metadata);
  } catch (const fab::UserError&) {
    return 0;  // rejected with a message: the expected outcome for bad input
  }
  for (const auto& [name, e] : entries)  // accepted: every entry must lie inside the data
    if (e.begin > e.end || e.end > data_bytes) __builtin_trap();
  return 0;
}
