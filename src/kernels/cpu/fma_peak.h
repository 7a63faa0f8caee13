#pragma once
// This machine's arithmetic peak, measured: register-only loops of fused multiply-adds on every
// thread, in the widest vectors the chosen CPU kernels use (AVX-512 or AVX2), and of AVX512-BF16's
// bf16 dot products where the CPU has them. An AVX2 core peaks at half an AVX-512 core (8 floats a
// vector instead of 16), so MFU on each kind of host is against its own peak.
namespace fab::cpu {

// fp32 FMA GFLOP/s of `threads` threads together, in AVX-512 or AVX2 vectors: the best of
// `rounds` runs of a few milliseconds each. The machine may be shared: a round short enough to
// fall between two of the scheduler's time slices measures the core, where one of 20 ms read half
// of it on a loaded 2-core host (and the cache then kept that).
double measured_fma_peak_gflops(bool avx512, int threads, int rounds = 16);

// bf16 GFLOP/s of vdpbf16ps (16 lanes x 2 products a lane per instruction) on `threads` threads;
// 0 where the CPU has no AVX512-BF16.
double measured_bf16_dot_peak_gflops(int threads, int rounds = 16);

}  // namespace fab::cpu
