#include "core/allocator.h"

#include <malloc.h>
#include <sys/mman.h>

#include <cstdlib>
#include <new>

#include "core/block_cache.h"

namespace fab {

std::string_view category_name(MemoryCategory c) {
  switch (c) {
    case MemoryCategory::parameters: return "parameters";
    case MemoryCategory::gradients: return "gradients";
    case MemoryCategory::optimizer_state: return "optimizer_state";
    case MemoryCategory::activations: return "activations";
    case MemoryCategory::temporaries: return "temporaries";
  }
  return "?";
}

void fix_system_mmap_threshold() {
#ifdef __GLIBC__
  mallopt(M_MMAP_THRESHOLD, 128 * 1024);  // setting it turns the dynamic adjustment off
#endif
}

static void raise_peak(std::atomic<size_t>& peak, size_t value) {
  size_t old = peak.load(std::memory_order_relaxed);
  while (value > old && !peak.compare_exchange_weak(old, value)) {
  }
}

void Allocator::account(MemoryCategory category, ptrdiff_t delta) {
  auto i = size_t(category);
  size_t now = live_[i].fetch_add(size_t(delta)) + size_t(delta);
  raise_peak(peak_[i], now);
  size_t total = total_live_.fetch_add(size_t(delta)) + size_t(delta);
  raise_peak(total_peak_, total);
}

void* Allocator::allocate(size_t bytes, MemoryCategory category) {
  void* p = raw_allocate(bytes == 0 ? 1 : bytes);
  account(category, ptrdiff_t(bytes));
  return p;
}

void Allocator::release(void* ptr, size_t bytes, MemoryCategory category) {
  if (!ptr) return;
  raw_release(ptr);
  account(category, -ptrdiff_t(bytes));
}

MemoryStats Allocator::stats(MemoryCategory category) const {
  auto i = size_t(category);
  return {live_[i].load(), peak_[i].load()};
}

MemoryStats Allocator::total() const { return {total_live_.load(), total_peak_.load()}; }

void Allocator::reset_peaks() {
  for (size_t i = 0; i < kNumMemoryCategories; ++i) peak_[i] = live_[i].load();
  total_peak_ = total_live_.load();
}

HostAllocator::HostAllocator() : cache_(std::make_unique<BlockCache>()) {}

HostAllocator::~HostAllocator() { release_cached(); }

size_t HostAllocator::cached_bytes() const { return cache_->cached_bytes(); }

namespace {

// Blocks of 64 KiB and more are mapped and unmapped directly: freed, they go back to the system at
// once. Through malloc they would raise glibc's dynamic mmap threshold and come from the heap
// afterwards, where blocks of ever new sizes fragment it and it never shrinks. (At 1 MiB, a small
// model's activations of 128 KiB-1 MiB left 13 MB free but resident in the heap at the peak of a
// 209 MB run; a mapping wastes at most one 4 KiB page in 16 here.)
constexpr size_t kMappedBlock = size_t(1) << 16;

void* system_allocate(size_t bytes) {
  if (bytes < kMappedBlock) return std::aligned_alloc(64, bytes);
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}

void system_free(void* p, size_t bytes) {
  if (bytes < kMappedBlock) std::free(p);
  else ::munmap(p, bytes);
}

}  // namespace

void HostAllocator::release_cached() { cache_->drain(system_free); }

void HostAllocator::hold_cached(bool on) { on ? cache_->hold() : cache_->end_hold(); }

void* HostAllocator::raw_allocate(size_t bytes) {
  const size_t rounded = BlockCache::size_class(bytes);
  if (void* p = cache_->take(rounded)) return p;
  cache_->make_room(rounded, system_free);
  void* p = system_allocate(rounded);
  if (!p) throw std::bad_alloc();
  cache_->track(p, rounded);
  return p;
}

void HostAllocator::raw_release(void* ptr) { cache_->put(ptr); }

}  // namespace fab
