#pragma once
// The narrow backend interface: memory, copies and the table of compute kernels of one device
// kind. core/ only declares it; the backends implement it in the layer above, kernels/, which
// defines backend() (src/kernels/cpu/cpu_backend.cpp). The CPU backend is always present. The
// CUDA slot holds the CUDA backend when the build found nvcc (src/kernels/cuda/), else a stub
// (src/core/cuda_stub_backend.cpp), so CPU-only builds compile and say clearly that CUDA is
// missing. Another accelerator plugs in by implementing this class and its KernelTable.
#include <string>

#include "core/allocator.h"
#include "core/device.h"
#include "core/dtype.h"

namespace fab {

struct KernelTable;

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual bool available() const = 0;
  virtual Allocator& allocator() = 0;
  virtual void copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) = 0;
  virtual void fill_zero(void* dst, size_t bytes) = 0;
  // The compute kernels; the stub throws.
  virtual const KernelTable& kernels() const = 0;
};

Backend& backend(DeviceKind kind);
// Plugs in the backend of a kind other than cpu and cuda (the tests' guard device). Until one
// is installed, backend(kind) of that kind throws.
void install_backend(DeviceKind kind, Backend* backend);
// The device a `device:` setting names: cpu; cuda (a UserError naming the missing build, GPU
// or driver when this build or machine has none); auto (cuda when it is available, else cpu).
Device resolve_device(const std::string& name);
// The CUDA backend of this build: the real one, or the stub when built without CUDA. Its
// available() is false, with the reason in name(), when the build or the machine lacks CUDA.
Backend& cuda_backend();

}  // namespace fab
