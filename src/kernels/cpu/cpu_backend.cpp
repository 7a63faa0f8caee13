// The CPU backend (host memory, the CPU kernel table) and backend(): here in kernels/, above
// core/, so that core/ includes no kernels/ header.
#include "core/backend.h"

#include <omp.h>

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/pages.h"
#include "kernels/kernel_table.h"

namespace fab {
namespace {

class CpuBackend final : public Backend {
 public:
  std::string name() const override { return "cpu (" + std::string(cpu_kernels().isa) + ")"; }
  bool available() const override { return true; }
  Allocator& allocator() override { return allocator_; }
  void copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) override {
    if (!dst_device.is_host()) return backend(dst_device.kind).copy(dst, dst_device, src, src_device, bytes);
    if (!src_device.is_host()) return backend(src_device.kind).copy(dst, dst_device, src, src_device, bytes);
    std::memcpy(dst, src, bytes);
  }
  // Gradients are zero-filled on first touch in backward, between parallel kernels: a serial
  // memset of a few MB left the other threads waiting (2% of a bf16 step here).
  void fill_zero(void* dst, size_t bytes) override {
    constexpr size_t kParallelFrom = size_t(1) << 20;
    if (bytes < kParallelFrom || omp_in_parallel()) return void(std::memset(dst, 0, bytes));
#pragma omp parallel
    {
      const size_t parts = size_t(omp_get_num_threads()), part = size_t(omp_get_thread_num());
      const size_t chunk = (bytes / parts + 63) / 64 * 64, begin = std::min(bytes, part * chunk);
      std::memset(static_cast<char*>(dst) + begin, 0, std::min(bytes - begin, chunk));
    }
  }
  // Page mappings: a released page reads zero and comes back when it is touched.
  Tensor releasable_zeros(int64_t numel, DType dtype, MemoryCategory category) override {
    return mapped_zeros(numel, dtype, category);
  }
  void decommit(void* data, size_t bytes) override { zero_and_release(data, bytes); }
  void commit(void*, size_t) override {}
  size_t resident_bytes(const void* data, size_t bytes) override { return fab::resident_bytes(data, bytes); }
  const KernelTable& kernels() const override { return cpu_kernels(); }

 private:
  HostAllocator allocator_;
};

Backend*& installed_guard() {
  static Backend* guard = nullptr;
  return guard;
}

}  // namespace

void install_backend(DeviceKind kind, Backend* b) {
  FAB_CHECK(kind == DeviceKind::guard, "only the guard device's backend is installed at run time");
  installed_guard() = b;
}

Backend& backend(DeviceKind kind) {
  static CpuBackend cpu;
  if (kind == DeviceKind::cpu) return cpu;
  if (kind == DeviceKind::cuda) return cuda_backend();
  FAB_CHECK(installed_guard() != nullptr, "the guard device is used but its backend is not installed (tests only)");
  return *installed_guard();
}

Device resolve_device(const std::string& name) {
  if (name == "cpu") return Device::cpu();
  FAB_USER_CHECK(name == "cuda" || name == "auto", "device \"{}\": expected cpu, cuda or auto", name);
  if (cuda_backend().available()) return Device::cuda(0);  // the backend picks the process's GPU
  FAB_USER_CHECK(name == "auto", "device: cuda, but CUDA cannot be used here: {}", cuda_backend().name());
  return Device::cpu();
}

}  // namespace fab
