#include "core/backend.h"

#include <cstring>

#include "core/error.h"
#include "kernels/kernel_table.h"

namespace fab {
namespace {

class CpuBackend final : public Backend {
 public:
  std::string name() const override { return "cpu (" + std::string(cpu_kernels().isa) + ")"; }
  bool available() const override { return true; }
  Allocator& allocator() override { return allocator_; }
  void copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) override {
    if (dst_device.kind != DeviceKind::cpu || src_device.kind != DeviceKind::cpu)
      return cuda_backend().copy(dst, dst_device, src, src_device, bytes);  // to or from a device
    std::memcpy(dst, src, bytes);
  }
  void fill_zero(void* dst, size_t bytes) override { std::memset(dst, 0, bytes); }
  const KernelTable& kernels() const override { return cpu_kernels(); }

 private:
  HostAllocator allocator_;
};

}  // namespace

Backend& backend(DeviceKind kind) {
  static CpuBackend cpu;
  return kind == DeviceKind::cpu ? static_cast<Backend&>(cpu) : cuda_backend();
}

}  // namespace fab
