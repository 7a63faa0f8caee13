#pragma once
// This machine's arithmetic peak, measured: register-only loops of fused multiply-adds on every
// thread, in the widest vectors the chosen CPU kernels use (AVX-512 or AVX2), and of AVX512-BF16's
// bf16 dot products where the CPU has them. An AVX2 core peaks at half an AVX-512 core (8 floats a
// vector instead of 16), so MFU on each kind of host is against its own peak.
namespace fab::cpu {

// fp32 FMA GFLOP/s of `threads` threads together, in AVX-512 or AVX2 vectors (best of `rounds`
// runs of about 0.03 s each on a 3 GHz core; the machine may be shared and noisy).
double measured_fma_peak_gflops(bool avx512, int threads, int rounds = 3);

// bf16 GFLOP/s of vdpbf16ps (16 lanes x 2 products a lane per instruction) on `threads` threads;
// 0 where the CPU has no AVX512-BF16.
double measured_bf16_dot_peak_gflops(int threads, int rounds = 3);

}  // namespace fab::cpu
