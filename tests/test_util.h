#pragma once
// Shared helpers: where the PyTorch fixtures are, and tensor comparisons with a stated tolerance.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace fab::test {

// Written by tests/reference/make_reference.py (make test runs it into build/reference).
inline std::string reference_dir() {
  const char* dir = std::getenv("FAB_REFERENCE_DIR");
  return dir ? dir : "build/reference";
}

// max |a - b| / max(max |b|, tiny): the error relative to the tensor's scale.
inline double scaled_error(const float* a, const float* b, int64_t n) {
  double diff = 0, scale = 1e-30;
  for (int64_t i = 0; i < n; ++i) {
    diff = std::fmax(diff, std::fabs(double(a[i]) - double(b[i])));
    scale = std::fmax(scale, std::fabs(double(b[i])));
  }
  return diff / scale;
}

// "key: value" lines as key=value overrides: a test's extra settings replace its base config's
// (a YAML text may not set a key twice).
inline std::vector<std::string> as_overrides(const std::string& yaml_lines) {
  std::vector<std::string> out;
  std::istringstream in(yaml_lines);
  for (std::string line; std::getline(in, line);) {
    const size_t colon = line.find(": ");
    if (colon != std::string::npos) out.push_back(line.substr(0, colon) + "=" + line.substr(colon + 2));
  }
  return out;
}

inline void expect_close(const Tensor& actual, const Tensor& expected, double tolerance, const std::string& what) {
  ASSERT_EQ(actual.numel(), expected.numel()) << what;
  double err = scaled_error(actual.data<float>(), expected.data<float>(), actual.numel());
  EXPECT_LE(err, tolerance) << what << ": error " << err << " relative to the tensor's max";
}

}  // namespace fab::test
