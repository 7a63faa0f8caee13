// MFU's denominator on a CPU: measured once per host and thread count, cached, overridable.
#include <gtest/gtest.h>

#include <omp.h>
#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "kernels/cpu/matmul_onednn.h"
#include "kernels/cpu/machine_peak.h"
#include "test_util.h"

namespace fab {
namespace {

// FABRICA_CACHE pointed at a fresh folder for one test, and FAB_PEAK_GFLOPS unset.
struct FreshCache {
  std::string dir;
  explicit FreshCache(const std::string& name) : dir(test::fresh_dir(name)) {
    ::setenv("FABRICA_CACHE", dir.c_str(), 1);
    ::unsetenv("FAB_PEAK_GFLOPS");
  }
  ~FreshCache() { ::unsetenv("FABRICA_CACHE"); }
};

// GFLOP/s of oneDNN's fp32 GEMM at n^3 on this process's threads.
double gemm_gflops(int64_t n) {
  std::vector<float> a(size_t(n * n), 0.5f), b(size_t(n * n), 0.25f), c(size_t(n * n));
  MatmulArgs args{};
  args.a = a.data();
  args.b = b.data();
  args.c = c.data();
  args.m = args.n = args.k = n;
  args.dtype = DType::f32;
  cpu::matmul(args);
  const auto start = std::chrono::steady_clock::now();
  int reps = 0;
  double seconds = 0;
  while (seconds < 0.3) {
    cpu::matmul(args);
    ++reps;
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  return 2.0 * double(n * n * n) * reps / seconds / 1e9;
}

TEST(MachinePeak, MeasuredOnceThenReadFromTheCache) {
  FreshCache cache("machine_peak_cache");
  const int threads = omp_get_max_threads();
  const MachinePeak first = machine_peak(threads);
  EXPECT_GT(first.fp32_gflops, 0);
  EXPECT_GE(first.bf16_gflops, first.fp32_gflops);
  EXPECT_EQ(first.threads, threads);
  EXPECT_EQ(first.source.rfind("measured now, cached in " + cache.dir + "/machine_peak.json", 0), 0u) << first.source;
  const MachinePeak again = machine_peak(threads);
  EXPECT_EQ(again.source, "cached in " + cache.dir + "/machine_peak.json");
  EXPECT_EQ(again.fp32_gflops, first.fp32_gflops);
  EXPECT_EQ(again.bf16_gflops, first.bf16_gflops);
  EXPECT_EQ(again.bf16_basis, first.bf16_basis);
  // Another thread count is another entry, measured afresh.
  EXPECT_EQ(machine_peak(threads + 1).source.rfind("measured now", 0), 0u);
}

TEST(MachinePeak, Bf16PeakFollowsTheIsaOfTheGemms) {
  FreshCache cache("machine_peak_bf16");
  const MachinePeak p = machine_peak(1);
  const std::string isa = cpu::onednn_isa();
  EXPECT_EQ(p.isa, isa);
  if (!cpu::bf16_gemm_path().native) {  // bf16 GEMMs widened to fp32
    EXPECT_EQ(p.bf16_gflops, p.fp32_gflops) << p.bf16_basis;
  } else if (isa == "avx512_core_amx") {
    EXPECT_DOUBLE_EQ(p.bf16_gflops, 16 * p.fp32_gflops);
  } else {  // vdpbf16ps, taken only where it outruns the FMA (twice its rate on AMD Zen 4/5)
    EXPECT_EQ(isa, "avx512_core_bf16");
    EXPECT_GT(p.bf16_gflops, 0.8 * p.fp32_gflops) << p.bf16_basis;
  }
}

// The bf16 GEMM path: native only where oneDNN's bf16 arithmetic is the faster (AMX, or a
// vdpbf16ps that outruns the FMA), widened elsewhere; FAB_BF16_GEMM overrides, and a wrong value
// is a UserError naming it.
TEST(MachinePeak, Bf16GemmsTakeTheFasterPathAndTheEnvironmentOverrides) {
  ::unsetenv("FAB_BF16_GEMM");
  const cpu::Bf16GemmPath chosen = cpu::bf16_gemm_path();
  const std::string isa = cpu::onednn_isa();
  if (isa == "avx512_core_amx") {
    EXPECT_TRUE(chosen.native) << chosen.why;
  } else if (isa == "avx512_core_bf16") {  // decided by the two probes, which it names
    EXPECT_NE(chosen.why.find("vdpbf16ps"), std::string::npos) << chosen.why;
  } else {
    EXPECT_FALSE(chosen.native) << chosen.why;
  }
  ::setenv("FAB_BF16_GEMM", "widened", 1);
  EXPECT_FALSE(cpu::bf16_gemm_path().native);
  ::setenv("FAB_BF16_GEMM", "fast", 1);
  EXPECT_THROW(cpu::bf16_gemm_path(), UserError);
  ::unsetenv("FAB_BF16_GEMM");
  EXPECT_EQ(cpu::bf16_gemm_path().native, chosen.native);
}

// The peak is a ceiling: oneDNN's best fp32 GEMM stays under it (with room for a noisy machine:
// the probe's rounds are short). Against the old fixed 157.5 GFLOP/s a thread, an AVX2 host's
// GEMM read as a third of what it is.
TEST(MachinePeak, AGemmDoesNotExceedTheMeasuredPeak) {
  FreshCache cache("machine_peak_gemm");
  const int threads = omp_get_max_threads();
  const double peak = machine_peak(threads).fp32_gflops;
  const double gemm = gemm_gflops(512);
  EXPECT_LT(gemm, 1.25 * peak) << "GEMM " << gemm << " GFLOP/s, peak " << peak;
  EXPECT_GT(gemm, 0.1 * peak) << "GEMM " << gemm << " GFLOP/s, peak " << peak;
}

TEST(MachinePeak, EnvironmentOverridesAndAnUnreadableCacheIsMeasuredAgain) {
  FreshCache cache("machine_peak_env");
  ::setenv("FAB_PEAK_GFLOPS", "12.5", 1);
  const MachinePeak p = machine_peak(2);
  EXPECT_EQ(p.fp32_gflops, 12.5);
  EXPECT_EQ(p.bf16_gflops, 12.5);
  EXPECT_EQ(p.source, "FAB_PEAK_GFLOPS (GFLOP/s per process)");
  EXPECT_FALSE(std::filesystem::exists(cache.dir + "/machine_peak.json"));
  ::setenv("FAB_PEAK_GFLOPS", "fast", 1);
  EXPECT_THROW(machine_peak(2), UserError);
  ::unsetenv("FAB_PEAK_GFLOPS");

  std::ofstream(cache.dir + "/machine_peak.json") << "{ not json";
  const MachinePeak measured = machine_peak(1);
  EXPECT_EQ(measured.source.rfind("measured now, cached in", 0), 0u) << measured.source;
  EXPECT_EQ(machine_peak(1).source.rfind("cached in", 0), 0u);
  // An entry whose figure is not a number (edited by hand) is measured again, not an exception.
  std::ifstream in(cache.dir + "/machine_peak.json");
  nlohmann::json file = nlohmann::json::parse(in);
  in.close();
  for (auto& entry : file) entry["fp32_gflops"] = "fast";
  std::ofstream(cache.dir + "/machine_peak.json") << file.dump();
  EXPECT_EQ(machine_peak(1).source.rfind("measured now, cached in", 0), 0u);
}

}  // namespace
}  // namespace fab
