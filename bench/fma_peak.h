#pragma once
// The machine's fp32 FMA peak as measured, for MFU: a register-only loop of fused multiply-adds on
// every thread, in the widest vectors the chosen CPU kernels use (AVX-512 or AVX2). An AVX2 core
// peaks at half an AVX-512 core (8 floats a vector instead of 16), so MFU on each kind of host is
// against its own peak.
namespace fab::bench {
double measured_fma_peak_gflops(bool avx512, int threads);
}
