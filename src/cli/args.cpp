#include "cli/args.h"

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
      switches_.insert(name);
    } else if (options.count(name)) {
      FAB_USER_CHECK(i + 1 < argc, "{} needs a value", a);
      values_[name] = argv[++i];
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

}  // namespace fab
