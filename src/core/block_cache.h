#pragma once
// Released memory blocks kept by (rounded) size for reuse, and the size of every block handed
// out, shared by the host and the CUDA allocators: a training step allocates the same sizes
// every step, and giving blocks back to the system (munmap, cudaFree) made each step pay again.
#include <cstddef>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/error.h"

namespace fab {

class BlockCache {
 public:
  // A cached block of exactly `rounded` bytes, now in use, or nullptr.
  void* take(size_t rounded) {
    std::lock_guard lock(mutex_);
    auto it = free_blocks_.find(rounded);
    if (it == free_blocks_.end() || it->second.empty()) return nullptr;
    void* p = it->second.back();
    it->second.pop_back();
    cached_ -= rounded;
    in_use_[p] = rounded;
    return p;
  }
  // A block fresh from the system, now in use.
  void track(void* p, size_t rounded) {
    std::lock_guard lock(mutex_);
    in_use_[p] = rounded;
  }
  // A block handed out by take() or track() goes back into the cache.
  void put(void* p) {
    std::lock_guard lock(mutex_);
    auto it = in_use_.find(p);
    FAB_CHECK(it != in_use_.end(), "release of a pointer this allocator did not hand out");
    free_blocks_[it->second].push_back(p);
    cached_ += it->second;
    in_use_.erase(it);
  }
  // Hands every cached block to free_block(pointer, bytes) and forgets it.
  template <typename FreeBlock>
  void drain(FreeBlock free_block) {
    std::lock_guard lock(mutex_);
    for (auto& [size, blocks] : free_blocks_)
      for (void* p : blocks) free_block(p, size);
    free_blocks_.clear();
    cached_ = 0;
  }
  size_t cached_bytes() const {
    std::lock_guard lock(mutex_);
    return cached_;
  }

 private:
  mutable std::mutex mutex_;
  std::unordered_map<size_t, std::vector<void*>> free_blocks_;
  std::unordered_map<void*, size_t> in_use_;
  size_t cached_ = 0;
};

}  // namespace fab
