#pragma once
// Device memory through cudaMalloc (never managed memory), kept for reuse by size like the host
// allocator: a training step allocates the same activation sizes every step, and cudaMalloc /
// cudaFree synchronise the device. Every kernel runs on one stream, so a block released on the
// host can be handed out again at once: any later use is ordered after the earlier kernels.
// Accounting (live/peak per category, Allocator) counts what is in use, not what is cached.
#include <atomic>
#include <memory>

#include "core/allocator.h"

namespace fab {
class BlockCache;
}

namespace fab::cuda {

class CudaAllocator final : public Allocator {
 public:
  CudaAllocator();
  ~CudaAllocator() override;
  size_t cached_bytes() const;
  size_t reserved_bytes() const;  // held from cudaMalloc: in use plus cached
  void release_cached();          // cudaFree of every cached block

 protected:
  void hold_cached(bool on) override;
  void* raw_allocate(size_t bytes) override;
  void raw_release(void* ptr) override;

 private:
  std::unique_ptr<BlockCache> cache_;
  std::atomic<size_t> reserved_{0};
};

}  // namespace fab::cuda
