#include "core/profiler.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace fab {
namespace {

struct Totals {
  std::mutex mutex;
  std::map<std::string, std::pair<double, long>> by_name;
  ~Totals() {
    std::vector<std::pair<std::string, std::pair<double, long>>> rows(by_name.begin(), by_name.end());
    std::sort(rows.begin(), rows.end(), [](auto& a, auto& b) { return a.second.first > b.second.first; });
    double total = 0;
    for (auto& r : rows) total += r.second.first;
    std::fprintf(stderr, "%-28s %10s %8s %7s\n", "profile: op", "seconds", "calls", "share");
    for (auto& [name, v] : rows)
      std::fprintf(stderr, "%-28s %10.3f %8ld %6.1f%%\n", name.c_str(), v.first, v.second, 100.0 * v.first / total);
  }
};

Totals& totals() {
  static Totals t;
  return t;
}

}  // namespace

bool profiling_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("FAB_PROFILE");
    return v && *v && std::string(v) != "0";
  }();
  return enabled;
}

void profile_add(const char* name, double seconds) {
  Totals& t = totals();
  std::lock_guard lock(t.mutex);
  auto& entry = t.by_name[name];
  entry.first += seconds;
  entry.second += 1;
}

}  // namespace fab
