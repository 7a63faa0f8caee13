#pragma once
// A small command-line reader: positional words, `--flag value` options and `--switch`es, with
// one clear message for anything unknown or missing.
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace fab {

class Args {
 public:
  // `options` take a value, `switches` do not; anything else starting with "--" is an error, and
  // so is an option or switch given twice (which value was meant cannot be told).
  Args(int argc, char** argv, int first, const std::set<std::string>& options, const std::set<std::string>& switches);

  const std::vector<std::string>& positional() const { return positional_; }
  bool has(const std::string& name) const { return values_.count(name) != 0; }
  std::string get(const std::string& name, const std::string& fallback = "") const;
  double get_number(const std::string& name, double fallback) const;
  // A number that must lie in [min, max] (and be an integer for get_integer).
  double get_number(const std::string& name, double fallback, double min, double max) const;
  int64_t get_integer(const std::string& name, int64_t fallback, int64_t min, int64_t max) const;
  bool flag(const std::string& name) const { return switches_.count(name) != 0; }

 private:
  std::vector<std::string> positional_;
  std::map<std::string, std::string> values_;
  std::set<std::string> switches_;
};

}  // namespace fab
