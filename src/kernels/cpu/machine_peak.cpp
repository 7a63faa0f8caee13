#include "kernels/cpu/machine_peak.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/file_write.h"
#include "kernels/cpu/fma_peak.h"
#include "kernels/cpu/matmul_onednn.h"

namespace fab {
namespace {

std::string cpu_model_name() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);)
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown cpu";
}

MachinePeak measure(const std::string& isa, int threads) {
  MachinePeak p;
  p.threads = threads;
  p.isa = isa;
  const bool avx512 = isa.rfind("avx512", 0) == 0;
  p.fp32_gflops = cpu::measured_fma_peak_gflops(avx512, threads);
  if (!cpu::bf16_gemm_path().native) {
    p.bf16_gflops = p.fp32_gflops;
    p.bf16_basis = "bf16 GEMMs are computed in fp32 on " + isa + ": the fp32 peak";
  } else if (isa == "avx512_core_amx") {
    p.bf16_gflops = 16 * p.fp32_gflops;
    p.bf16_basis = "AMX: 16x the AVX-512 fp32 FMA peak (512 bf16 multiply-adds a cycle against 32), not measured";
  } else {
    p.bf16_gflops = cpu::measured_bf16_dot_peak_gflops(threads);
    p.bf16_basis = "AVX512-BF16 dot products (vdpbf16ps), measured";
  }
  return p;
}

nlohmann::json read_cache(const std::string& path) {
  std::ifstream in(path);
  if (!in) return nlohmann::json::object();
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  return j.is_object() ? j : nlohmann::json::object();  // unreadable: measured again, written anew
}

}  // namespace

double peak_gflops_from_environment() {
  const char* env = std::getenv("FAB_PEAK_GFLOPS");
  if (!env) return 0;
  const double gflops = std::atof(env);
  FAB_USER_CHECK(gflops > 0, "FAB_PEAK_GFLOPS={}: expected GFLOP/s per process, a positive number", env);
  return gflops;
}

MachinePeak machine_peak(int threads) {
  const std::string isa = cpu::onednn_isa();
  if (const double gflops = peak_gflops_from_environment(); gflops > 0)
    return {gflops, gflops, threads, isa, "both set by FAB_PEAK_GFLOPS", "FAB_PEAK_GFLOPS (GFLOP/s per process)"};
  const std::string path = fabrica_cache_dir() + "/machine_peak.json";
  // "probe 2": rounds of a few ms (fma_peak.h); entries of the first probe (20 ms rounds, which read
  // half a core on a loaded host) are measured again.
  const std::string key = cpu_model_name() + " | " + isa + " | " + std::to_string(threads) + " threads | probe 2" +
                          (cpu::bf16_gemm_path().native ? "" : " | bf16 widened");
  nlohmann::json cache = read_cache(path);
  if (const auto it = cache.find(key); it != cache.end() && it->is_object()) {
    // A field of another type (a hand-edited file) counts as missing: measured again, not thrown.
    const auto number = [&](const char* field) {
      const auto f = it->find(field);
      return f != it->end() && f->is_number() ? f->get<double>() : 0.0;
    };
    const auto basis = it->find("bf16_basis");
    if (number("fp32_gflops") > 0 && number("bf16_gflops") > 0 && basis != it->end() && basis->is_string())
      return {number("fp32_gflops"), number("bf16_gflops"), threads, isa, basis->get<std::string>(), "cached in " + path};
  }
  MachinePeak p = measure(isa, threads);
  cache[key] = {{"fp32_gflops", p.fp32_gflops}, {"bf16_gflops", p.bf16_gflops}, {"bf16_basis", p.bf16_basis}};
  try {
    std::filesystem::create_directories(fabrica_cache_dir());
    write_file_atomically(path, cache.dump(2) + "\n");
    p.source = "measured now, cached in " + path;
  } catch (const std::exception& e) {  // a read-only home: the run goes on, measuring each time
    p.source = std::string("measured now, not cached: ") + e.what();
  }
  return p;
}

}  // namespace fab
