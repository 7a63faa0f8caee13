#pragma once
// Where the time goes: FAB_PROFILE=1 in the environment makes every ProfileScope add its wall
// time to a per-name total, printed to stderr (sorted, with call counts) when the process exits.
// While a trace records (core/trace.h), every ProfileScope is also a "compute" event of it.
#include <chrono>

#include "core/trace.h"

namespace fab {

bool profiling_enabled();
void profile_add(const char* name, double seconds);

class ProfileScope {
 public:
  explicit ProfileScope(const char* name) : name_(profiling_enabled() || trace::recording() ? name : nullptr) {
    if (name_) start_ = std::chrono::steady_clock::now();
  }
  ~ProfileScope() {
    if (!name_) return;
    const auto end = std::chrono::steady_clock::now();
    if (profiling_enabled()) profile_add(name_, std::chrono::duration<double>(end - start_).count());
    if (trace::recording()) trace::complete(trace::kCompute, name_, start_, end);
  }
  ProfileScope(const ProfileScope&) = delete;
  ProfileScope& operator=(const ProfileScope&) = delete;

 private:
  const char* name_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace fab
