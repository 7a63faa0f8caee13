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
#include "core/tensor.h"

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
  // Memory that can be handed back in parts: the flat parameter and gradient buffers, of which
  // ZeRO-2/3 keep resident only what a rank needs (parallel/data_parallel.h). A releasable tensor
  // starts zero-filled and usable. Its memory comes in granules: host pages, or the 2 MiB chunks a
  // GPU maps (CUDA's virtual memory management).
  //   decommit: the range reads as zeros from now on; its whole granules go back to the device,
  //             the partial ones at its ends are zeroed in place.
  //   commit:   makes the range usable again before anything reads or writes it, zero where it
  //             was decommitted. Host pages come back by themselves when touched, a device's
  //             granules must be mapped first: skipping it is a fault on a device.
  virtual Tensor releasable_zeros(int64_t numel, DType dtype, MemoryCategory category) = 0;
  virtual void decommit(void* data, size_t bytes) = 0;
  virtual void commit(void* data, size_t bytes) = 0;
  // Bytes of the granules overlapping [data, data + bytes) that hold memory now.
  virtual size_t resident_bytes(const void* data, size_t bytes) = 0;
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
