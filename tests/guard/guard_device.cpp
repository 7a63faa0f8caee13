#include "guard/guard_device.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <mutex>
#include <type_traits>
#include <vector>

#include "core/backend.h"
#include "core/error.h"
#include "core/tensor.h"
#include "kernels/kernel_table.h"

namespace fab::test {
namespace {

// One reserved range: allocations are page-aligned pieces of it, first fit from a free list, and
// the whole used part [base, base + top) changes protection at once -- except its decommitted
// pages (Backend::decommit), which stay PROT_NONE even inside a window until they are committed:
// a GPU's unmapped granules fault in its own kernels too.
class GuardArena {
 public:
  static constexpr size_t kReserved = size_t(16) << 30;  // address space only (MAP_NORESERVE)

  GuardArena() {
    void* p = ::mmap(nullptr, kReserved, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    FAB_CHECK(p != MAP_FAILED, "guard device: cannot reserve {} bytes of address space", kReserved);
    base_ = static_cast<char*>(p);
    page_ = size_t(::sysconf(_SC_PAGESIZE));
  }

  void* allocate(size_t bytes) {
    std::lock_guard lock(mutex_);
    const size_t size = std::max(page_, (bytes + page_ - 1) / page_ * page_);
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->second < size) continue;
      const size_t at = it->first, left = it->second - size;
      free_.erase(it);
      if (left) free_[at + size] = left;
      sizes_[at] = size;
      return base_ + at;
    }
    FAB_CHECK(top_ + size <= kReserved, "guard device: out of its {} reserved bytes", kReserved);
    const size_t at = top_;
    top_ += size;
    if (open_) protect(at, size, PROT_READ | PROT_WRITE);
    sizes_[at] = size;
    return base_ + at;
  }

  bool holds(const void* p) const {
    const char* c = static_cast<const char*>(p);
    return c >= base_ && c < base_ + kReserved;
  }

  void release(void* ptr) {
    std::lock_guard lock(mutex_);
    const size_t at = size_t(static_cast<char*>(ptr) - base_);
    auto it = sizes_.find(at);
    FAB_CHECK(it != sizes_.end(), "guard device: release of memory it did not hand out");
    const size_t size = it->second;
    sizes_.erase(it);
    ::madvise(base_ + at, size, MADV_DONTNEED);  // its pages go back; a reuse reads zeros
    forget_decommitted(at, at + size);
    free_[at] = size;
    merge_around(at, free_);
  }

  // The whole pages of [p, p + bytes) go back (reading zeros once committed) and stay closed;
  // the partial pages at its ends are zeroed.
  void decommit(void* p, size_t bytes) {
    std::lock_guard lock(mutex_);
    const size_t begin = offset(p), end = begin + bytes;
    const size_t first = round_up(begin), last = end / page_ * page_;
    if (first >= last) return zero(begin, end);
    zero(begin, first);
    zero(last, end);
    ::madvise(base_ + first, last - first, MADV_DONTNEED);
    decommitted_[first] = last - first;
    merge_around(first, decommitted_);
    if (open_) protect(first, last - first, PROT_NONE);
  }

  // The pages overlapping [p, p + bytes) are usable again.
  void commit(void* p, size_t bytes) {
    std::lock_guard lock(mutex_);
    const size_t begin = offset(p) / page_ * page_, end = round_up(offset(p) + bytes);
    forget_decommitted(begin, end);
    if (open_) protect(begin, end - begin, PROT_READ | PROT_WRITE);
  }

  // Bytes of the pages overlapping [p, p + bytes) that are not decommitted.
  size_t resident(const void* p, size_t bytes) {
    std::lock_guard lock(mutex_);
    return resident_unlocked(offset(p), offset(p) + bytes);
  }

  // The host may touch device memory while at least one window is open.
  void open() {
    std::lock_guard lock(mutex_);
    if (open_++ != 0) return;
    protect(0, top_, PROT_READ | PROT_WRITE);
    for (const auto& [at, size] : decommitted_) protect(at, size, PROT_NONE);
  }
  void close() {
    std::lock_guard lock(mutex_);
    if (--open_ == 0) protect(0, top_, PROT_NONE);
  }

 private:
  void protect(size_t at, size_t size, int prot) {
    if (size) FAB_CHECK(::mprotect(base_ + at, size, prot) == 0, "guard device: mprotect failed");
  }
  size_t resident_unlocked(size_t from, size_t to) const {
    const size_t begin = from / page_ * page_, end = round_up(to);
    size_t held = end - begin;
    for (const auto& [at, size] : decommitted_) held -= overlap(at, at + size, begin, end);
    return held;
  }
  size_t offset(const void* p) const { return size_t(static_cast<const char*>(p) - base_); }
  size_t round_up(size_t at) const { return (at + page_ - 1) / page_ * page_; }
  static size_t overlap(size_t a, size_t b, size_t c, size_t d) {
    return std::max(a, c) < std::min(b, d) ? std::min(b, d) - std::max(a, c) : 0;
  }
  // Zeroes [begin, end) inside one page, unless that page is decommitted (it reads zero already).
  void zero(size_t begin, size_t end) {
    if (begin >= end || resident_unlocked(begin, end) == 0) return;
    if (!open_) protect(begin / page_ * page_, round_up(end) - begin / page_ * page_, PROT_READ | PROT_WRITE);
    std::memset(base_ + begin, 0, end - begin);
    if (!open_) protect(begin / page_ * page_, round_up(end) - begin / page_ * page_, PROT_NONE);
  }
  // Takes [begin, end) out of the decommitted runs (splitting those that stick out).
  void forget_decommitted(size_t begin, size_t end) {
    auto it = decommitted_.upper_bound(begin);
    if (it != decommitted_.begin()) --it;
    while (it != decommitted_.end() && it->first < end) {
      const size_t at = it->first, stop = at + it->second;
      if (stop <= begin) {
        ++it;
        continue;
      }
      it = decommitted_.erase(it);
      if (at < begin) decommitted_[at] = begin - at;
      if (stop > end) decommitted_[end] = stop - end;
    }
  }
  // Joins the run starting at `at` with its neighbours in `runs` where they touch.
  static void merge_around(size_t at, std::map<size_t, size_t>& runs) {
    auto it = runs.find(at);
    if (auto next = std::next(it); next != runs.end() && it->first + it->second == next->first) {
      it->second += next->second;
      runs.erase(next);
    }
    if (it != runs.begin()) {
      auto prev = std::prev(it);
      if (prev->first + prev->second == it->first) {
        prev->second += it->second;
        runs.erase(it);
      }
    }
  }

  std::mutex mutex_;
  char* base_ = nullptr;
  size_t page_ = 4096, top_ = 0;
  int open_ = 0;
  std::map<size_t, size_t> free_, sizes_, decommitted_;  // offset -> bytes
};

GuardArena& arena() {
  static GuardArena* a = new GuardArena;  // never destroyed: tensors may outlive static destructors
  return *a;
}

struct Window {
  Window() { arena().open(); }
  ~Window() { arena().close(); }
  Window(const Window&) = delete;
  Window& operator=(const Window&) = delete;
};

class GuardAllocator final : public Allocator {
 protected:
  void* raw_allocate(size_t bytes) override { return arena().allocate(bytes); }
  void raw_release(void* ptr) override { arena().release(ptr); }
};

// A kernel's memory arguments must be device memory: a host buffer handed to a kernel is what a
// GPU cannot read (a forgotten copy of ids, labels or a mask), so it fails here as it would there.
void expect_on_device(const void* p, const char* what) {
  FAB_CHECK(p == nullptr || arena().holds(p), "guard device: kernel {} was given host memory", what);
}
template <typename T>
void check_argument(const T& arg, const char* what) {
  if constexpr (std::is_pointer_v<T>) expect_on_device(arg, what);
  if constexpr (std::is_same_v<T, MatmulArgs>) {
    expect_on_device(arg.a, what), expect_on_device(arg.b, what), expect_on_device(arg.c, what);
  }
  if constexpr (std::is_same_v<T, AttentionShape>) expect_on_device(arg.doc_start, what);
}

template <auto Slot>
struct SlotName {
  static inline const char* value = "?";
};

// Each slot of the table: the CPU kernel, its memory arguments checked, run inside a window.
template <auto Slot, typename F>
struct Guarded;
template <auto Slot, typename R, typename... Args>
struct Guarded<Slot, R (*)(Args...)> {
  static R call(Args... args) {
    (check_argument(args, SlotName<Slot>::value), ...);
    const Window open;
    return (cpu_kernels().*Slot)(args...);
  }
};

template <auto Slot>
void guard_slot(KernelTable& t) {
  using F = std::remove_reference_t<decltype(t.*Slot)>;
  if constexpr (std::is_pointer_v<F> && std::is_function_v<std::remove_pointer_t<F>>) t.*Slot = Guarded<Slot, F>::call;
}

KernelTable guarded_table() {
  KernelTable t{};
  t.isa = "guard (the CPU kernels)";
#define FAB_GUARD_SLOT(slot) SlotName<&KernelTable::slot>::value = #slot, guard_slot<&KernelTable::slot>(t);
  FAB_KERNEL_SLOTS(FAB_GUARD_SLOT)
#undef FAB_GUARD_SLOT
  FAB_CHECK(empty_kernel_slot(t) == nullptr, "guard table: slot {} empty", empty_kernel_slot(t));
  return t;
}

class GuardBackend final : public Backend {
 public:
  std::string name() const override { return "guard (test device: host access is a fault)"; }
  bool available() const override { return true; }
  Allocator& allocator() override { return allocator_; }
  void copy(void* dst, Device, const void* src, Device, size_t bytes) override {
    const Window open;
    std::memcpy(dst, src, bytes);
  }
  void fill_zero(void* dst, size_t bytes) override {
    const Window open;
    std::memset(dst, 0, bytes);
  }
  Tensor releasable_zeros(int64_t numel, DType dtype, MemoryCategory category) override {
    const size_t bytes = std::max<size_t>(1, size_t(numel) * dtype_size(dtype));
    void* p = allocator_.allocate(bytes, category);
    fill_zero(p, bytes);
    return Tensor::from_external(
        p, {numel}, dtype, [this, p, bytes, category] { allocator_.release(p, bytes, category); }, Device::guard());
  }
  void decommit(void* data, size_t bytes) override { arena().decommit(data, bytes); }
  void commit(void* data, size_t bytes) override { arena().commit(data, bytes); }
  size_t resident_bytes(const void* data, size_t bytes) override { return arena().resident(data, bytes); }
  const KernelTable& kernels() const override { return table_; }
  size_t live() const { return allocator_.total().live; }

 private:
  GuardAllocator allocator_;
  KernelTable table_ = guarded_table();
};

GuardBackend& guard_backend() {
  static GuardBackend* b = [] {
    auto* made = new GuardBackend;
    install_backend(DeviceKind::guard, made);
    return made;
  }();
  return *b;
}

// The collectives of `host` on guard buffers, staged through host copies.
class GuardCollectives final : public Communicator {
 public:
  explicit GuardCollectives(Communicator& host) : host_(host) {}
  explicit GuardCollectives(std::unique_ptr<Communicator> owned) : owned_(std::move(owned)), host_(*owned_) {}
  int rank() const override { return host_.rank(); }
  int size() const override { return host_.size(); }
  CommHandle all_reduce(float* data, int64_t n, const std::string& what) override {
    return staged(data, n * 4, [&](void* h) { return host_.all_reduce(static_cast<float*>(h), n, what); });
  }
  CommHandle all_reduce(double* data, int64_t n, const std::string& what) override {
    return staged(data, n * 8, [&](void* h) { return host_.all_reduce(static_cast<double*>(h), n, what); });
  }
  CommHandle reduce_scatter(float* data, int64_t n, const std::string& what) override {
    return staged(data, n * 4, [&](void* h) { return host_.reduce_scatter(static_cast<float*>(h), n, what); });
  }
  CommHandle all_gather(float* data, int64_t n, const std::string& what) override {
    return staged(data, n * 4, [&](void* h) { return host_.all_gather(static_cast<float*>(h), n, what); });
  }
  CommHandle broadcast(void* data, int64_t bytes, int root, const std::string& what) override {
    return staged(data, bytes, [&](void* h) { return host_.broadcast(h, bytes, root, what); });
  }
  void send(const void* data, int64_t bytes, int peer) override {
    std::vector<char> h(static_cast<size_t>(bytes));
    guard_backend().copy(h.data(), Device::cpu(), data, guard_device(), size_t(bytes));
    host_.send(h.data(), bytes, peer);
  }
  void recv(void* data, int64_t bytes, int peer) override {
    std::vector<char> h(static_cast<size_t>(bytes));
    host_.recv(h.data(), bytes, peer);
    guard_backend().copy(data, guard_device(), h.data(), Device::cpu(), size_t(bytes));
  }
  void barrier(const std::string& what) override { host_.barrier(what); }
  std::unique_ptr<Communicator> split(int color, int key) override {
    return std::make_unique<GuardCollectives>(host_.split(color, key));
  }
  CommStats stats() const override { return {}; }  // its traffic is the host group's, counted there

 private:
  // Copies `bytes` of device `data` to the host, runs `collective` there, waits, and copies the
  // result back: synchronous, so the returned handle is already done.
  template <typename F>
  CommHandle staged(void* data, int64_t bytes, F&& collective) {
    std::vector<char> h(static_cast<size_t>(bytes));
    guard_backend().copy(h.data(), Device::cpu(), data, guard_device(), size_t(bytes));
    collective(h.data()).wait();
    guard_backend().copy(data, guard_device(), h.data(), Device::cpu(), size_t(bytes));
    auto task = std::make_shared<CommTask>();
    task->done = true;
    return CommHandle(task, nullptr);
  }

  std::unique_ptr<Communicator> owned_;
  Communicator& host_;
};

}  // namespace

Device guard_device() {
  guard_backend();
  return Device::guard();
}

size_t guard_live_bytes() { return guard_backend().live(); }

std::unique_ptr<Communicator> guard_collectives(Communicator& host) { return std::make_unique<GuardCollectives>(host); }

}  // namespace fab::test
