#pragma once
// An ordered parallel map over OpenMP's threads (omp_get_max_threads(); the `threads` config key
// sets it): results land at their index, so the output is the sequential loop's whatever the
// thread count or schedule. When calls throw, the exception of the lowest index is rethrown after
// every lower index has run: the error a loop in order would have met first.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <mutex>
#include <type_traits>
#include <vector>

namespace fab {

// fn(i) for every i in [0, n), called concurrently from several threads; `grain` indices are
// handed out at a time. The result type must be default-constructible.
template <typename Fn>
auto parallel_map(size_t n, Fn&& fn, int64_t grain = 8) {
  using Result = std::decay_t<decltype(fn(size_t{0}))>;
  std::vector<Result> out(n);
  std::atomic<size_t> first_failure{n};
  std::exception_ptr failure;
  std::mutex failure_mutex;
#pragma omp parallel for schedule(dynamic, grain)
  for (int64_t i = 0; i < static_cast<int64_t>(n); ++i) {
    const size_t index = static_cast<size_t>(i);
    if (index > first_failure.load(std::memory_order_relaxed)) continue;  // a lower index failed
    try {
      out[index] = fn(index);
    } catch (...) {
      std::lock_guard<std::mutex> lock(failure_mutex);
      if (index < first_failure.load(std::memory_order_relaxed)) {
        failure = std::current_exception();
        first_failure.store(index, std::memory_order_relaxed);
      }
    }
  }
  if (failure) std::rethrow_exception(failure);
  return out;
}

}  // namespace fab
