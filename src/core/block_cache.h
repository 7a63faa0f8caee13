#pragma once
// Released memory blocks kept for reuse, and the size of every block handed out, shared by the
// host and the CUDA allocators: a training step allocates the same sizes every step, and giving
// blocks back to the system (munmap, cudaFree) made each step pay again.
//
// Memory must not depend on how many distinct shapes a run has seen (variable-length SFT makes
// new sizes every batch), so, as PyTorch's caching allocator does:
//  * sizes are rounded to classes, four per power of two (1, 1.25, 1.5, 1.75 x 2^k): a size
//    wastes at most a quarter;
//  * a request takes the smallest cached block that is large enough, up to twice its size;
//  * a request no cached block fits first frees cached blocks (largest first) of at least its
//    size, so that what the process holds (in use + cached) grows only when what is in use does;
//  * except while a hold is on (hold / end_hold, Allocator::HoldCachedBlocks): then nothing is freed.
//    A loop that allocates and frees a few sizes in turn, one token's decode pass through every
//    layer, otherwise frees the large blocks (the MLP's) to make room for the middle ones and maps
//    them again a moment later: 14 map/unmap pairs a decode step, 20% of a rollout's time. Held,
//    what the process keeps grows by at most that loop's working set.
#include <cstddef>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/error.h"

namespace fab {

class BlockCache {
 public:
  // The size class of a request: a multiple of 64 bytes, then at most 25% above `bytes`.
  static size_t size_class(size_t bytes) {
    size_t rounded = (bytes + 63) / 64 * 64;
    if (rounded <= 256) return rounded;
    size_t octave = size_t(1) << (63 - __builtin_clzll(rounded));  // the power of two at or below
    const size_t step = octave / 4;
    return (rounded + step - 1) / step * step;
  }

  // The smallest cached block of at least `rounded` bytes (and at most twice that), now in use, or
  // nullptr. Its size is what size_of() reports.
  void* take(size_t rounded) {
    std::lock_guard lock(mutex_);
    auto it = free_blocks_.lower_bound(rounded);
    if (it == free_blocks_.end() || it->first > 2 * rounded) return nullptr;
    void* p = it->second.back();
    const size_t size = it->first;
    it->second.pop_back();
    if (it->second.empty()) free_blocks_.erase(it);
    cached_ -= size;
    in_use_[p] = size;
    return p;
  }
  // Before a fresh block of `rounded` bytes: hands cached blocks, largest first, to
  // free_block(pointer, bytes) until at least `rounded` bytes are freed or none is left.
  template <typename FreeBlock>
  void make_room(size_t rounded, FreeBlock free_block) {
    std::lock_guard lock(mutex_);
    if (holds_ > 0) return;
    size_t freed = 0;
    while (freed < rounded && !free_blocks_.empty()) {
      auto largest = std::prev(free_blocks_.end());
      const size_t size = largest->first;
      free_block(largest->second.back(), size);
      largest->second.pop_back();
      if (largest->second.empty()) free_blocks_.erase(largest);
      cached_ -= size;
      freed += size;
    }
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
  void hold() {
    std::lock_guard lock(mutex_);
    ++holds_;
  }
  void end_hold() {
    std::lock_guard lock(mutex_);
    FAB_CHECK(holds_ > 0, "end_hold without a hold");
    --holds_;
  }
  size_t cached_bytes() const {
    std::lock_guard lock(mutex_);
    return cached_;
  }
  size_t in_use_bytes() const {
    std::lock_guard lock(mutex_);
    size_t total = 0;
    for (const auto& [p, size] : in_use_) total += size;
    return total;
  }

 private:
  mutable std::mutex mutex_;
  std::map<size_t, std::vector<void*>> free_blocks_;  // by size, for the best fit
  std::unordered_map<void*, size_t> in_use_;
  size_t cached_ = 0;
  int holds_ = 0;  // while above 0, make_room frees nothing
};

}  // namespace fab
