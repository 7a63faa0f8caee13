#pragma once
// Host memory with accounting: every allocation names a category, and the allocator keeps live
// and peak bytes for each, so the trainer and the tests can ask where memory went.
#include <array>
#include <atomic>
#include <cstddef>
#include <memory>
#include <string_view>

namespace fab {

enum class MemoryCategory : uint8_t { parameters, gradients, optimizer_state, activations, temporaries };
constexpr size_t kNumMemoryCategories = 5;
std::string_view category_name(MemoryCategory c);

// Fixes glibc's mmap threshold at its default (128 KiB) for the whole process: called first thing
// in `fabrica`'s main. Left dynamic, every freed mapping raises the threshold to its size (up to
// 32 MiB), and from then on blocks below it come from the heap, which fragments and never shrinks.
// On AVX2 hosts oneDNN's jit GEMM mallocs and frees its packing buffers (up to the packed weight,
// 3.7 MB for a 3210x256 head) on every call: a ZeRO-3 run of 101 MB resident held 14 MB more,
// free but resident, and the planner's peak (which counts live bytes) came out 13% low. The cost:
// those buffers are mapped afresh on each call, 2-5% of tokens/s on tiny models (bench/RESULTS.md).
void fix_system_mmap_threshold();

struct MemoryStats {
  size_t live = 0;
  size_t peak = 0;
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  void* allocate(size_t bytes, MemoryCategory category);
  void release(void* ptr, size_t bytes, MemoryCategory category);
  // Counts memory this allocator did not hand out (a page mapping, say) under `category`.
  void account_external(MemoryCategory category, ptrdiff_t delta) { account(category, delta); }

  MemoryStats stats(MemoryCategory category) const;
  MemoryStats total() const;
  // Starts a new peak window: each peak becomes the current live figure.
  void reset_peaks();

  // While one lives, released blocks stay cached for reuse rather than being freed to make room
  // for other sizes (block_cache.h says when that matters: generation's decode passes).
  class HoldCachedBlocks {
   public:
    explicit HoldCachedBlocks(Allocator& allocator) : allocator_(allocator) { allocator_.hold_cached(true); }
    ~HoldCachedBlocks() { allocator_.hold_cached(false); }
    HoldCachedBlocks(const HoldCachedBlocks&) = delete;
    HoldCachedBlocks& operator=(const HoldCachedBlocks&) = delete;

   private:
    Allocator& allocator_;
  };

 protected:
  virtual void hold_cached(bool) {}  // allocators without a cache of blocks hold nothing
  virtual void* raw_allocate(size_t bytes) = 0;
  virtual void raw_release(void* ptr) = 0;

 private:
  void account(MemoryCategory category, ptrdiff_t delta);
  std::array<std::atomic<size_t>, kNumMemoryCategories> live_{};
  std::array<std::atomic<size_t>, kNumMemoryCategories> peak_{};
  std::atomic<size_t> total_live_{0}, total_peak_{0};
};

// 64-byte aligned host memory (one cache line, one AVX-512 register) that keeps released blocks
// for reuse by size: a training step allocates the same activation sizes every step, and handing
// large blocks back to the OS (glibc munmaps them) made every step page-fault them in again.
// Accounting (live/peak per category) counts what is in use, not what is cached.
class BlockCache;

class HostAllocator final : public Allocator {
 public:
  HostAllocator();
  ~HostAllocator() override;
  size_t cached_bytes() const;
  void release_cached();  // returns every cached block to the OS

 protected:
  void hold_cached(bool on) override;
  void* raw_allocate(size_t bytes) override;
  void raw_release(void* ptr) override;

 private:
  std::unique_ptr<BlockCache> cache_;
};

}  // namespace fab
