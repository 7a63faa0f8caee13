#include "kernels/cuda/cuda_allocator.h"

#include <mutex>
#include <unordered_map>
#include <vector>

#include "kernels/cuda/cuda_util.h"

namespace fab::cuda {
namespace {

// Small blocks round to 512 bytes, large ones to 2 MiB, so near sizes share cached blocks.
size_t round_size(size_t bytes) {
  const size_t unit = bytes < (size_t(1) << 20) ? 512 : (size_t(2) << 20);
  return (bytes + unit - 1) / unit * unit;
}

std::string memory_summary(const Allocator& a, size_t cached) {
  size_t free_bytes = 0, total_bytes = 0;
  cudaMemGetInfo(&free_bytes, &total_bytes);
  std::string s = format("device free {} MiB of {} MiB; in use by Fabrica {} MiB (cached {} MiB):", free_bytes >> 20,
                         total_bytes >> 20, a.total().live >> 20, cached >> 20);
  for (size_t i = 0; i < kNumMemoryCategories; ++i) {
    const auto c = MemoryCategory(i);
    s += format(" {} {} MiB", category_name(c), a.stats(c).live >> 20);
  }
  return s;
}

}  // namespace

struct CudaAllocator::Cache {
  mutable std::mutex mutex;
  std::unordered_map<size_t, std::vector<void*>> free_blocks;
  std::unordered_map<void*, size_t> sizes;  // every block from cudaMalloc not yet freed
  size_t cached = 0, reserved = 0;
};

CudaAllocator::CudaAllocator() : cache_(std::make_unique<Cache>()) {}

// At exit the CUDA context may already be gone: free what is cached, ignore errors.
CudaAllocator::~CudaAllocator() {
  for (auto& [size, blocks] : cache_->free_blocks)
    for (void* p : blocks) cudaFree(p);
}

size_t CudaAllocator::cached_bytes() const {
  std::lock_guard lock(cache_->mutex);
  return cache_->cached;
}

size_t CudaAllocator::reserved_bytes() const {
  std::lock_guard lock(cache_->mutex);
  return cache_->reserved;
}

void CudaAllocator::release_cached() {
  Cache& c = *cache_;
  std::lock_guard lock(c.mutex);
  for (auto& [size, blocks] : c.free_blocks)
    for (void* p : blocks) {
      FAB_CUDA_CHECK(cudaFree(p));
      c.sizes.erase(p);
      c.reserved -= size;
    }
  c.free_blocks.clear();
  c.cached = 0;
}

void* CudaAllocator::raw_allocate(size_t bytes) {
  const size_t rounded = round_size(bytes);
  Cache& c = *cache_;
  {
    std::lock_guard lock(c.mutex);
    auto it = c.free_blocks.find(rounded);
    if (it != c.free_blocks.end() && !it->second.empty()) {
      void* p = it->second.back();
      it->second.pop_back();
      c.cached -= rounded;
      return p;
    }
  }
  stream();  // selects this process's device before the first cudaMalloc
  void* p = nullptr;
  cudaError_t err = cudaMalloc(&p, rounded);
  if (err == cudaErrorMemoryAllocation) {  // give the cache back and try once more
    cudaGetLastError();
    release_cached();
    err = cudaMalloc(&p, rounded);
  }
  if (err != cudaSuccess) {
    cudaGetLastError();
    throw Error(format("cudaMalloc of {} MiB failed ({}); {}", rounded >> 20, cudaGetErrorString(err),
                       memory_summary(*this, cached_bytes())));
  }
  std::lock_guard lock(c.mutex);
  c.sizes[p] = rounded;
  c.reserved += rounded;
  return p;
}

void CudaAllocator::raw_release(void* ptr) {
  Cache& c = *cache_;
  std::lock_guard lock(c.mutex);
  auto it = c.sizes.find(ptr);
  FAB_CHECK(it != c.sizes.end(), "release of a pointer this CUDA allocator did not hand out");
  c.free_blocks[it->second].push_back(ptr);
  c.cached += it->second;
}

}  // namespace fab::cuda
