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
    FAB_CHECK(dst_device.kind == DeviceKind::cpu && src_device.kind == DeviceKind::cpu,
              "cpu backend copies host memory only ({} -> {})", src_device.str(), dst_device.str());
    std::memcpy(dst, src, bytes);
  }
  void fill_zero(void* dst, size_t bytes) override { std::memset(dst, 0, bytes); }
  const KernelTable& kernels() const override { return cpu_kernels(); }

 private:
  HostAllocator allocator_;
};

// Stands in for CUDA in builds without it: every use fails with a message that says so.
class CudaStubBackend final : public Backend {
 public:
  std::string name() const override { return "cuda (not built)"; }
  bool available() const override { return false; }
  Allocator& allocator() override { fail(); }
  void copy(void*, Device, const void*, Device, size_t) override { fail(); }
  void fill_zero(void*, size_t) override { fail(); }
  const KernelTable& kernels() const override { fail(); }

 private:
  [[noreturn]] static void fail() {
    throw UserError("this Fabrica was built without CUDA; rebuild with the CUDA toolkit (nvcc) on PATH");
  }
};

}  // namespace

Backend& backend(DeviceKind kind) {
  static CpuBackend cpu;
  static CudaStubBackend cuda;
  return kind == DeviceKind::cpu ? static_cast<Backend&>(cpu) : static_cast<Backend&>(cuda);
}

}  // namespace fab
