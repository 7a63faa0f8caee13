#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "core/allocator.h"
#include "core/backend.h"
#include "core/block_cache.h"
#include "core/error.h"
#include "core/rng.h"
#include "core/tensor.h"

namespace fab {
namespace {

TEST(Allocator, TracksLiveAndPeakBytesPerCategory) {
  Allocator& a = backend(DeviceKind::cpu).allocator();
  a.reset_peaks();
  const size_t act0 = a.stats(MemoryCategory::activations).live;
  const size_t opt0 = a.stats(MemoryCategory::optimizer_state).live;
  {
    Tensor x = Tensor::empty({1000}, DType::f32, MemoryCategory::activations);
    Tensor y = Tensor::empty({10, 10}, DType::bf16, MemoryCategory::optimizer_state);
    EXPECT_EQ(a.stats(MemoryCategory::activations).live, act0 + 4000);
    EXPECT_EQ(a.stats(MemoryCategory::optimizer_state).live, opt0 + 200);
    Tensor view = x.view(10, {5, 2});  // views share storage: no new bytes
    EXPECT_EQ(a.stats(MemoryCategory::activations).live, act0 + 4000);
  }
  EXPECT_EQ(a.stats(MemoryCategory::activations).live, act0);
  EXPECT_EQ(a.stats(MemoryCategory::optimizer_state).live, opt0);
  EXPECT_GE(a.stats(MemoryCategory::activations).peak, act0 + 4000);
  a.reset_peaks();
  EXPECT_EQ(a.stats(MemoryCategory::activations).peak, act0);
}

TEST(Tensor, ViewsCheckBoundsAndShareData) {
  Tensor x = Tensor::zeros({4, 3}, DType::f32, MemoryCategory::temporaries);
  Tensor row = x.view(3, {3});
  row.data<float>()[1] = 5.0f;
  EXPECT_EQ(x.data<float>()[4], 5.0f);
  EXPECT_THROW(x.view(10, {3}), Error);
  Tensor copy = x.clone(MemoryCategory::temporaries);
  copy.data<float>()[4] = 1.0f;
  EXPECT_EQ(x.data<float>()[4], 5.0f);
}

// Without a usable GPU (the stub of a CPU-only build, or a CUDA build on a machine with no device)
// a CUDA tensor is a user error that says why.
TEST(Backend, CudaWithoutADeviceIsAUserError) {
  Backend& cuda = backend(DeviceKind::cuda);
  if (cuda.available()) GTEST_SKIP() << "a CUDA device is present (" << cuda.name() << ") [needs: no gpu]";
  EXPECT_THROW(Tensor::empty({4}, DType::f32, MemoryCategory::temporaries, Device::cuda(0)), UserError);
}

// Variable-length SFT: every step allocates buffers sized by its batch length, then frees them.
// What the allocator holds (in use + cached) must not grow with the number of distinct lengths:
// after 200 steps it is within 15% of what it held once the longest batch had been seen.
TEST(HostAllocator, HeldMemoryStaysFlatOverManyDistinctSizes) {
  HostAllocator alloc;
  Rng lengths(11);
  auto step = [&](int64_t length) {
    std::vector<std::pair<void*, size_t>> blocks;
    for (size_t per_token : {4096u, 11264u, 1024u, 32768u, 4096u})  // activations of a few ops
      blocks.emplace_back(alloc.allocate(size_t(length) * per_token, MemoryCategory::activations),
                          size_t(length) * per_token);
    for (auto& [p, bytes] : blocks) alloc.release(p, bytes, MemoryCategory::activations);
  };
  step(512);  // the longest batch comes early, as in SFT with cutoff_len
  for (int s = 1; s < 20; ++s) step(16 + int64_t(lengths.next_u64() % 497));
  const size_t held_after_20 = alloc.cached_bytes();
  for (int s = 20; s < 200; ++s) step(16 + int64_t(lengths.next_u64() % 497));
  EXPECT_LE(alloc.cached_bytes(), held_after_20 * 115 / 100)
      << "held " << alloc.cached_bytes() << " bytes after 200 steps, " << held_after_20 << " after 20";
  EXPECT_EQ(alloc.total().live, 0u);  // the accounting is of the bytes asked for, and all came back
  EXPECT_EQ(alloc.total().peak, size_t(512) * (4096 + 11264 + 1024 + 32768 + 4096));
}

// A loop of two sizes that cannot share a block (one token's decode pass: the attention's and the
// MLP's buffers, layer after layer): unheld, each request frees the other's cached block to make
// room and needs a fresh one; under a hold both stay cached and every pass reuses them.
TEST(BlockCache, AHoldKeepsTheBlocksOfALoopOfSizes) {
  auto fresh_blocks = [](bool held) {
    BlockCache cache;
    std::vector<std::unique_ptr<char[]>> system;  // stand-ins for mapped blocks: distinct addresses
    int fresh = 0;
    if (held) cache.hold();
    for (int pass = 0; pass < 10; ++pass)
      for (size_t bytes : {size_t(100) << 10, size_t(400) << 10}) {
        const size_t rounded = BlockCache::size_class(bytes);
        void* p = cache.take(rounded);
        if (!p) {
          cache.make_room(rounded, [](void*, size_t) {});
          p = system.emplace_back(std::make_unique<char[]>(1)).get();
          cache.track(p, rounded);
          ++fresh;
        }
        cache.put(p);
      }
    if (held) cache.end_hold();
    return fresh;
  };
  EXPECT_EQ(fresh_blocks(false), 20);
  EXPECT_EQ(fresh_blocks(true), 2);
}

TEST(BlockCache, SizeClassesWasteAtMostAQuarter) {
  for (size_t bytes : {1ul, 64ul, 65ul, 300ul, 1000ul, 4097ul, 123457ul, 1ul << 20, (1ul << 20) + 1, 3000001ul}) {
    const size_t c = BlockCache::size_class(bytes);
    EXPECT_GE(c, bytes);
    EXPECT_EQ(c % 64, 0u);
    EXPECT_LE(double(c), std::max(64.0, 1.25 * double(bytes) + 64)) << bytes;
  }
}

}  // namespace
}  // namespace fab
