// Stands in for the CUDA backend in builds without the CUDA toolkit (CMake did not find nvcc, or
// FAB_CUDA=OFF): every use fails with a message that says so. Built instead of src/kernels/cuda/.
#include "core/backend.h"
#include "core/error.h"

namespace fab {
namespace {

class CudaStubBackend final : public Backend {
 public:
  std::string name() const override { return "cuda (not built: this Fabrica has no CUDA backend)"; }
  bool available() const override { return false; }
  Allocator& allocator() override { fail(); }
  void copy(void*, Device, const void*, Device, size_t) override { fail(); }
  void fill_zero(void*, size_t) override { fail(); }
  Tensor releasable_zeros(int64_t, DType, MemoryCategory) override { fail(); }
  void decommit(void*, size_t) override { fail(); }
  void commit(void*, size_t) override { fail(); }
  size_t resident_bytes(const void*, size_t) override { fail(); }
  const KernelTable& kernels() const override { fail(); }

 private:
  [[noreturn]] static void fail() {
    throw UserError("this Fabrica was built without CUDA; rebuild with the CUDA toolkit (nvcc) on PATH");
  }
};

}  // namespace

Backend& cuda_backend() {
  static CudaStubBackend stub;
  return stub;
}

}  // namespace fab
