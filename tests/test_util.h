#pragma once
// Shared helpers: where the PyTorch fixtures are, and tensor comparisons with a stated tolerance.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "io/safetensors.h"

namespace fab::test {

// Written by tests/reference/make_reference.py (make test runs it into build/reference).
inline std::string reference_dir() {
  const char* dir = std::getenv("FAB_REFERENCE_DIR");
  return dir ? dir : "build/reference";
}

// This test process's own folder under the test temporary folder, removed when the process exits
// (FAB_KEEP_TEST_DIRS=1 keeps it). ctest runs every case as a process of its own, several at once:
// fixed names directly under TempDir() were shared by cases running together, which rewrote each
// other's model folders mid-run.
inline const std::string& process_scratch_root() {
  struct Root {
    pid_t owner = ::getpid();
    std::string path = ::testing::TempDir() + "/fabrica-test-" + std::to_string(owner);
    Root() { std::filesystem::create_directories(path); }
    ~Root() {
      std::error_code ignored;  // a forked death-test child leaves its parent's folder alone
      if (::getpid() == owner && !std::getenv("FAB_KEEP_TEST_DIRS")) std::filesystem::remove_all(path, ignored);
    }
  };
  static const Root root;
  return root.path;
}

// A path in this process's scratch folder; nothing is created there.
inline std::string scratch_path(const std::string& name) { return process_scratch_root() + "/" + name; }

// An empty folder of that name in this process's scratch folder.
inline std::string fresh_dir(const std::string& name) {
  const std::string dir = scratch_path(name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
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

// Every tensor of safetensors file `a` equals the one of that name in `b` bit for bit (as f32).
// Returns how many it compared.
inline size_t expect_same_tensors(const std::string& a, const std::string& b, const std::string& what = "") {
  const SafetensorsFile fa = SafetensorsFile::open(a), fb = SafetensorsFile::open(b);
  for (const auto& [name, entry] : fa.entries()) {
    const Tensor ta = fa.as_f32(name), tb = fb.as_f32(name);
    EXPECT_EQ(ta.bytes(), tb.bytes()) << what << " " << name;
    if (ta.bytes() == tb.bytes()) {
      EXPECT_EQ(0, std::memcmp(ta.raw(), tb.raw(), ta.bytes())) << what << " " << name;
    }
  }
  return fa.entries().size();
}

// ||actual - expected|| / ||expected|| (2-norms): how far a bf16 run's tensor is from the fp32
// reference's as a whole.
inline double norm_error(const Tensor& actual, const Tensor& expected) {
  double diff = 0, norm = 1e-60;
  for (int64_t i = 0; i < std::min(actual.numel(), expected.numel()); ++i) {
    const double a = actual.data<float>()[i], b = expected.data<float>()[i];
    diff += (a - b) * (a - b);
    norm += b * b;
  }
  return actual.numel() == expected.numel() ? std::sqrt(diff / norm) : INFINITY;
}

// A bf16 run's gradients against an fp32 reference, tensor by tensor in norm: the median and the
// worst error within bounds. (A tiny mixture-of-experts model's gradients move a lot under bf16:
// transformers' own under torch.autocast bf16 are median 2-7%, worst 29-51% off its fp32 ones.)
inline void expect_bf16_gradients_close(const std::vector<std::pair<std::string, double>>& errors, double median,
                                        double worst) {
  ASSERT_FALSE(errors.empty());
  std::vector<std::pair<std::string, double>> sorted = errors;
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
  EXPECT_LE(sorted[sorted.size() / 2].second, median) << "median error: " << sorted[sorted.size() / 2].first;
  EXPECT_LE(sorted.back().second, worst) << "worst error: " << sorted.back().first;
}

inline void expect_close(const Tensor& actual, const Tensor& expected, double tolerance, const std::string& what) {
  ASSERT_EQ(actual.numel(), expected.numel()) << what;
  double err = scaled_error(actual.data<float>(), expected.data<float>(), actual.numel());
  EXPECT_LE(err, tolerance) << what << ": error " << err << " relative to the tensor's max";
}

}  // namespace fab::test
