#pragma once
#include <cstdint>
#include <string>

namespace fab {

// guard: the test-only device of tests/core/guard_device.h (host memory the host may not touch),
// which proves the training path device-clean without a GPU.
enum class DeviceKind : uint8_t { cpu, cuda, guard };

struct Device {
  DeviceKind kind = DeviceKind::cpu;
  int index = 0;
  static Device cpu() { return {DeviceKind::cpu, 0}; }
  static Device cuda(int i) { return {DeviceKind::cuda, i}; }
  static Device guard() { return {DeviceKind::guard, 0}; }
  bool operator==(const Device&) const = default;
  bool is_host() const { return kind == DeviceKind::cpu; }
  std::string str() const {
    if (kind == DeviceKind::cpu) return "cpu";
    return (kind == DeviceKind::cuda ? "cuda:" : "guard:") + std::to_string(index);
  }
};

}  // namespace fab
