#pragma once
// Where the time goes: FAB_PROFILE=1 in the environment makes every ProfileScope add its wall
// time to a per-name total, printed to stderr (sorted, with call counts) when the process exits.
#include <chrono>

namespace fab {

bool profiling_enabled();
void profile_add(const char* name, double seconds);

class ProfileScope {
 public:
  explicit ProfileScope(const char* name) : name_(profiling_enabled() ? name : nullptr) {
    if (name_) start_ = std::chrono::steady_clock::now();
  }
  ~ProfileScope() {
    if (name_) profile_add(name_, std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
  }
  ProfileScope(const ProfileScope&) = delete;
  ProfileScope& operator=(const ProfileScope&) = delete;

 private:
  const char* name_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace fab
