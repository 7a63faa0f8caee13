#pragma once
#include <cstdint>
#include <string>

namespace fab {

enum class DeviceKind : uint8_t { cpu, cuda };

struct Device {
  DeviceKind kind = DeviceKind::cpu;
  int index = 0;
  static Device cpu() { return {DeviceKind::cpu, 0}; }
  static Device cuda(int i) { return {DeviceKind::cuda, i}; }
  bool operator==(const Device&) const = default;
  std::string str() const { return kind == DeviceKind::cpu ? "cpu" : "cuda:" + std::to_string(index); }
};

}  // namespace fab
