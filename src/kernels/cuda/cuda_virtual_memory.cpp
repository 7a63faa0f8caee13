#include "kernels/cuda/cuda_virtual_memory.h"

#include <cuda.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "kernels/cuda/cuda_allocator.h"
#include "kernels/cuda/cuda_util.h"

namespace fab::cuda {
namespace {

// The driver's virtual memory functions, found through the runtime (no link against libcuda).
struct Driver {
  decltype(&::cuMemAddressReserve) address_reserve = nullptr;
  decltype(&::cuMemAddressFree) address_free = nullptr;
  decltype(&::cuMemCreate) create = nullptr;
  decltype(&::cuMemRelease) release = nullptr;
  decltype(&::cuMemMap) map = nullptr;
  decltype(&::cuMemUnmap) unmap = nullptr;
  decltype(&::cuMemSetAccess) set_access = nullptr;
  decltype(&::cuMemGetAllocationGranularity) granularity = nullptr;
  decltype(&::cuGetErrorString) error_string = nullptr;
  decltype(&::cuDeviceGet) device_get = nullptr;
  decltype(&::cuDeviceGetAttribute) attribute = nullptr;

  Driver() {
    look_up(address_reserve, "cuMemAddressReserve");
    look_up(address_free, "cuMemAddressFree");
    look_up(create, "cuMemCreate");
    look_up(release, "cuMemRelease");
    look_up(map, "cuMemMap");
    look_up(unmap, "cuMemUnmap");
    look_up(set_access, "cuMemSetAccess");
    look_up(granularity, "cuMemGetAllocationGranularity");
    look_up(error_string, "cuGetErrorString");
    look_up(device_get, "cuDeviceGet");
    look_up(attribute, "cuDeviceGetAttribute");
  }

  bool complete = true;  // every function found

  template <typename F>
  void look_up(F& f, const char* name) {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess || !p) {
      cudaGetLastError();
      complete = false;
      return;
    }
    f = reinterpret_cast<F>(p);
  }

  void check(CUresult r, const char* what) const {
    if (r == CUDA_SUCCESS) return;
    const char* text = nullptr;
    error_string(r, &text);
    throw Error(format("CUDA driver call {} failed: {}", what, text ? text : "unknown error"));
  }
};

const Driver& driver() {
  static const Driver d;
  return d;
}

// Whether the buffers map granules (else: plain allocator memory): not with FAB_CUDA_VMM=0, nor
// where the driver or the device lacks virtual memory management (some virtual GPUs).
bool use_virtual_memory() {
  static const bool use = [] {
    const char* env = std::getenv("FAB_CUDA_VMM");
    if (env && std::strcmp(env, "0") == 0) return false;
    const Driver& d = driver();
    int supported = 0;
    CUdevice device = 0;
    stream();  // selects this process's device (and makes its context)
    if (d.complete && d.device_get(&device, device_index()) == CUDA_SUCCESS &&
        d.attribute(&supported, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, device) == CUDA_SUCCESS &&
        supported)
      return true;
    std::fprintf(stderr, "note: this CUDA driver or device lacks virtual memory management; ZeRO-2/3 release no "
                         "device memory\n");
    return false;
  }();
  return use;
}

// One reserved range and the physical granule mapped at each of its slots (0: none).
struct Buffer {
  CUdeviceptr base = 0;
  size_t granule = 0;
  std::vector<CUmemGenericAllocationHandle> mapped;
  MemoryCategory category = MemoryCategory::parameters;
  CudaAllocator* accounting = nullptr;
};

class Buffers {
 public:
  Tensor make(int64_t numel, DType dtype, MemoryCategory category, CudaAllocator& accounting) {
    prop_.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop_.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop_.location.id = device_index();
    size_t granule = 0;
    driver().check(driver().granularity(&granule, &prop_, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
                   "cuMemGetAllocationGranularity");
    const size_t bytes = std::max<size_t>(1, size_t(numel) * dtype_size(dtype));
    auto b = std::make_unique<Buffer>();
    b->granule = granule;
    b->mapped.assign((bytes + granule - 1) / granule, 0);
    b->category = category;
    b->accounting = &accounting;
    driver().check(driver().address_reserve(&b->base, b->mapped.size() * granule, granule, 0, 0),
                   "cuMemAddressReserve");
    void* data = reinterpret_cast<void*>(b->base);
    {
      std::lock_guard lock(mutex_);
      buffers_[b->base] = std::move(b);
    }
    try {
      commit(data, bytes);
    } catch (...) {
      free(data);
      throw;
    }
    // Device 0 as resolve_device names it: the backend has picked this process's GPU.
    return Tensor::from_external(data, {numel}, dtype, [this, data] { free(data); }, Device::cuda(0));
  }

  void decommit(void* data, size_t bytes) {
    if (bytes == 0) return;
    std::lock_guard lock(mutex_);
    auto [b, begin] = find(data);
    const size_t end = begin + bytes, g = b.granule;
    const size_t first = (begin + g - 1) / g, last = end / g;  // the whole granules inside
    auto zero = [&](size_t from, size_t to) {  // granule by granule: an unmapped one reads zero already
      for (size_t at = from; at < to;) {
        const size_t stop = std::min(to, (at / g + 1) * g);
        if (b.mapped[at / g])
          FAB_CUDA_CHECK(cudaMemsetAsync(reinterpret_cast<char*>(b.base) + at, 0, stop - at, stream()));
        at = stop;
      }
    };
    if (first >= last) return zero(begin, end);
    zero(begin, first * g);
    zero(last * g, end);
    bool synced = false;
    for (size_t i = first; i < last; ++i) {
      if (!b.mapped[i]) continue;
      if (!synced) FAB_CUDA_CHECK(cudaStreamSynchronize(stream()));  // kernels queued may still use it
      synced = true;
      unmap(b, i);
    }
  }

  void commit(void* data, size_t bytes) {
    if (bytes == 0) return;
    std::lock_guard lock(mutex_);
    auto [b, begin] = find(data);
    const size_t g = b.granule, end = begin + bytes;
    for (size_t i = begin / g; i < (end + g - 1) / g; ++i)
      if (!b.mapped[i]) map(b, i);
  }

  size_t resident(const void* data, size_t bytes) {
    if (bytes == 0) return 0;
    std::lock_guard lock(mutex_);
    auto [b, begin] = find(data);
    const size_t g = b.granule, end = begin + bytes;
    size_t held = 0;
    for (size_t i = begin / g; i < (end + g - 1) / g; ++i) held += b.mapped[i] ? g : 0;
    return held;
  }

 private:
  // The buffer holding `p`, and p's offset in it.
  std::pair<Buffer&, size_t> find(const void* p) {
    const CUdeviceptr at = reinterpret_cast<CUdeviceptr>(p);
    auto it = buffers_.upper_bound(at);
    FAB_CHECK(it != buffers_.begin(), "{} is not in a releasable CUDA buffer", p);
    Buffer& b = *std::prev(it)->second;
    FAB_CHECK(at - b.base < b.mapped.size() * b.granule, "{} is not in a releasable CUDA buffer", p);
    return {b, size_t(at - b.base)};
  }

  void map(Buffer& b, size_t i) {
    const Driver& d = driver();
    const CUdeviceptr at = b.base + i * b.granule;
    CUmemGenericAllocationHandle handle = 0;
    CUresult made = d.create(&handle, b.granule, &prop_, 0);
    if (made == CUDA_ERROR_OUT_OF_MEMORY) {  // the allocator's cached blocks back to the device, once
      b.accounting->release_cached();
      made = d.create(&handle, b.granule, &prop_, 0);
    }
    d.check(made, "cuMemCreate");
    d.check(d.map(at, b.granule, 0, handle, 0), "cuMemMap");
    CUmemAccessDesc access{};
    access.location = prop_.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    d.check(d.set_access(at, b.granule, &access, 1), "cuMemSetAccess");
    FAB_CUDA_CHECK(cudaMemsetAsync(reinterpret_cast<void*>(at), 0, b.granule, stream()));
    b.mapped[i] = handle;
    b.accounting->account_external(b.category, ptrdiff_t(b.granule));
  }

  void unmap(Buffer& b, size_t i) {
    const Driver& d = driver();
    d.check(d.unmap(b.base + i * b.granule, b.granule), "cuMemUnmap");
    d.check(d.release(b.mapped[i]), "cuMemRelease");
    b.mapped[i] = 0;
    b.accounting->account_external(b.category, -ptrdiff_t(b.granule));
  }

  // The tensor's last view is gone. At exit the context may be gone already: errors are ignored.
  void free(void* data) {
    std::lock_guard lock(mutex_);
    auto it = buffers_.find(reinterpret_cast<CUdeviceptr>(data));
    if (it == buffers_.end()) return;
    Buffer& b = *it->second;
    cudaStreamSynchronize(stream());
    for (size_t i = 0; i < b.mapped.size(); ++i) {
      if (!b.mapped[i]) continue;
      driver().unmap(b.base + i * b.granule, b.granule);
      driver().release(b.mapped[i]);
      b.accounting->account_external(b.category, -ptrdiff_t(b.granule));
    }
    driver().address_free(b.base, b.mapped.size() * b.granule);
    buffers_.erase(it);
  }

  std::mutex mutex_;
  CUmemAllocationProp prop_{};
  std::map<CUdeviceptr, std::unique_ptr<Buffer>> buffers_;
};

Buffers& buffers() {
  static Buffers* b = new Buffers;  // never destroyed: tensors may outlive static destructors
  return *b;
}

}  // namespace

Tensor releasable_zeros(int64_t numel, DType dtype, MemoryCategory category, CudaAllocator& accounting) {
  if (use_virtual_memory()) return buffers().make(numel, dtype, category, accounting);
  (void)accounting;  // Tensor::zeros accounts through the backend's allocator
  return Tensor::zeros({numel}, dtype, category, Device::cuda(0));
}
void decommit(void* data, size_t bytes) {
  if (use_virtual_memory()) return buffers().decommit(data, bytes);
  if (bytes) FAB_CUDA_CHECK(cudaMemsetAsync(data, 0, bytes, stream()));
}
void commit(void* data, size_t bytes) {
  if (use_virtual_memory()) buffers().commit(data, bytes);
}
size_t resident_bytes(const void* data, size_t bytes) {
  return use_virtual_memory() ? buffers().resident(data, bytes) : bytes;
}

}  // namespace fab::cuda
