#include "core/pages.h"

#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/error.h"

namespace fab {
namespace {

uintptr_t page_size() {
  static const uintptr_t size = uintptr_t(::sysconf(_SC_PAGESIZE));
  return size;
}

}  // namespace

Tensor mapped_zeros(int64_t numel, DType dtype, MemoryCategory category) {
  const size_t bytes = std::max<size_t>(1, size_t(numel) * dtype_size(dtype));
  void* data = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  FAB_CHECK(data != MAP_FAILED, "mmap of {} bytes failed", bytes);
  Allocator& accounting = backend(DeviceKind::cpu).allocator();
  accounting.account_external(category, ptrdiff_t(bytes));
  return Tensor::from_external(data, {numel}, dtype, [data, bytes, category, &accounting] {
    ::munmap(data, bytes);
    accounting.account_external(category, -ptrdiff_t(bytes));
  });
}

void zero_and_release(void* data, size_t bytes) {
  const uintptr_t begin = uintptr_t(data), end = begin + bytes, page = page_size();
  const uintptr_t first_page = (begin + page - 1) / page * page, last_page = end / page * page;
  if (first_page >= last_page) {  // no whole page inside
    std::memset(data, 0, bytes);
    return;
  }
  std::memset(data, 0, first_page - begin);
  std::memset(reinterpret_cast<void*>(last_page), 0, end - last_page);
  FAB_CHECK(::madvise(reinterpret_cast<void*>(first_page), last_page - first_page, MADV_DONTNEED) == 0,
            "madvise(MADV_DONTNEED) failed");
}

size_t resident_bytes(const void* data, size_t bytes) {
  if (bytes == 0) return 0;
  const uintptr_t page = page_size(), begin = uintptr_t(data) / page * page, end = uintptr_t(data) + bytes;
  const size_t pages = (end - begin + page - 1) / page;
  std::vector<unsigned char> in_core(pages);
  FAB_CHECK(::mincore(reinterpret_cast<void*>(begin), pages * page, in_core.data()) == 0, "mincore failed");
  size_t resident = 0;
  for (unsigned char c : in_core) resident += (c & 1) ? page : 0;
  return resident;
}

double process_resident_bytes() {
  std::ifstream in("/proc/self/status");
  std::string key;
  while (in >> key) {
    if (key == "VmRSS:") {
      double kib = 0;
      in >> kib;
      return kib * 1024;
    }
    in.ignore(1 << 12, '\n');
  }
  return 0;
}

double process_peak_resident_bytes() {
  struct rusage usage {};
  ::getrusage(RUSAGE_SELF, &usage);
  return double(usage.ru_maxrss) * 1024;
}

}  // namespace fab
