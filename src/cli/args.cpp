#include "cli/args.h"

#include <cmath>
#include <cstdlib>

#include "core/error.h"

namespace fab {

Args::Args(int argc, char** argv, int first, const std::set<std::string>& options,
           const std::set<std::string>& switches) {
  for (int i = first; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--", 0) != 0) {
      positional_.push_back(a);
      continue;
    }
    const std::string name = a.substr(2);
    if (switches.count(name)) {
      FAB_USER_CHECK(switches_.insert(name).second, "{} is given twice: give it once", a);
    } else if (options.count(name)) {
      FAB_USER_CHECK(i + 1 < argc, "{} needs a value", a);
      const auto [it, is_new] = values_.emplace(name, argv[i + 1]);
      FAB_USER_CHECK(is_new, "{} is given twice (\"{}\" and \"{}\"): give it once", a, it->second, argv[i + 1]);
      ++i;
    } else {
      throw UserError(format("unknown option {} (see --help)", a));
    }
  }
}

std::string Args::get(const std::string& name, const std::string& fallback) const {
  auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second;
}

double Args::get_number(const std::string& name, double fallback) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  char* end = nullptr;
  const double v = std::strtod(it->second.c_str(), &end);
  FAB_USER_CHECK(end && *end == '\0' && !it->second.empty(), "--{} expects a number, got \"{}\"", name, it->second);
  return v;
}

double Args::get_number(const std::string& name, double fallback, double min, double max) const {
  const double v = get_number(name, fallback);
  FAB_USER_CHECK(v >= min && v <= max, "--{} must be from {} to {}, got \"{}\"", name, min, max, get(name));
  return v;
}

int64_t Args::get_integer(const std::string& name, int64_t fallback, int64_t min, int64_t max) const {
  const double v = get_number(name, double(fallback));
  FAB_USER_CHECK(v == std::trunc(v) && v >= double(min) && v <= double(max),
                 "--{} must be an integer from {} to {}, got \"{}\"", name, min, max, get(name));
  return int64_t(v);
}

}  // namespace fab
