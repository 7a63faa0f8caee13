#include "kernels/cuda/cuda_allocator.h"

#include "core/block_cache.h"
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

CudaAllocator::CudaAllocator() : cache_(std::make_unique<BlockCache>()) {}

// At exit the CUDA context may already be gone: free what is cached, ignore errors.
CudaAllocator::~CudaAllocator() {
  cache_->drain([](void* p, size_t) { cudaFree(p); });
}

size_t CudaAllocator::cached_bytes() const { return cache_->cached_bytes(); }

size_t CudaAllocator::reserved_bytes() const { return reserved_.load(); }

void CudaAllocator::release_cached() {
  cache_->drain([this](void* p, size_t size) {
    FAB_CUDA_CHECK(cudaFree(p));
    reserved_ -= size;
  });
}

void* CudaAllocator::raw_allocate(size_t bytes) {
  const size_t rounded = round_size(bytes);
  if (void* p = cache_->take(rounded)) return p;
  stream();  // selects this process's device before the first cudaMalloc
  cache_->make_room(rounded, [this](void* block, size_t size) {
    FAB_CUDA_CHECK(cudaFree(block));
    reserved_ -= size;
  });
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
  cache_->track(p, rounded);
  reserved_ += rounded;
  return p;
}

void CudaAllocator::raw_release(void* ptr) { cache_->put(ptr); }

void CudaAllocator::hold_cached(bool on) { on ? cache_->hold() : cache_->end_hold(); }

}  // namespace fab::cuda
