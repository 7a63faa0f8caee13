#pragma once
// The denominator of MFU on a CPU: this machine's peak, measured once per host and cached.
// GEMMs do nearly all of a step's FLOPs, so the peak is that of the instruction set oneDNN's
// GEMMs run in (ONEDNN_MAX_CPU_ISA caps it):
//  * fp32: the FMA probe (kernels/cpu/fma_peak.h) in AVX-512 or AVX2 vectors;
//  * bf16 with AVX512-BF16 and no AMX: the vdpbf16ps probe (twice fp32 on an AMD Zen 4/5 core);
//  * bf16 on AMX: 16x the AVX-512 fp32 peak (a tile multiply does 512 bf16 multiply-adds a cycle
//    where AVX-512 does 32 fp32 ones); not measured;
//  * bf16 where its GEMMs are widened to fp32 (AVX2, AVX-512 without BF16, and AVX512-BF16 whose
//    vdpbf16ps is slower than the FMA: cpu::bf16_gemm_path()): the fp32 peak.
// FAB_PEAK_GFLOPS (GFLOP/s per process) overrides both.
#include <string>

namespace fab {

struct MachinePeak {
  double fp32_gflops = 0;  // one process's threads together
  double bf16_gflops = 0;
  int threads = 0;
  std::string isa;          // oneDNN's
  std::string bf16_basis;   // how the bf16 figure was found
  std::string source;       // "FAB_PEAK_GFLOPS", "measured now, cached in PATH", "cached in PATH"
};

// FAB_PEAK_GFLOPS (GFLOP/s per process), or 0 when unset; anything but a positive number is a
// UserError naming it.
double peak_gflops_from_environment();

// The peak of `threads` threads of this process. The first call on a host (per CPU model, oneDNN
// ISA and thread count) measures it, about 0.1-0.3 s, and writes it to machine_peak.json in the
// cache folder (core/file_write.h fabrica_cache_dir); later calls and runs read it from there.
// Every process of a run measures at once, as they will compute: the peak under full load.
MachinePeak machine_peak(int threads);

}  // namespace fab
