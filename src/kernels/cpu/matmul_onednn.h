#pragma once
#include <string>

#include "kernels/kernel_table.h"

namespace fab::cpu {
void matmul(const MatmulArgs& args);
// The instruction set oneDNN's GEMMs run in here: "avx512_core_amx", "avx512_core_bf16",
// "avx512_core_vnni", "avx512_core", "avx2_vnni", "avx2" (ONEDNN_MAX_CPU_ISA caps it).
std::string onednn_isa();
// "oneDNN 2.6.3, ISA avx512_core_amx" for `fabrica env`.
std::string onednn_description();
// How bf16 GEMMs run on this CPU: oneDNN's bf16 matmul (native), or operands widened to f32 for
// the f32 matmul, where oneDNN has no bf16 matmul or its bf16 arithmetic is slower than fp32's
// (matmul_onednn.cpp says how it is chosen). `why` names the path and the reason, for `fabrica env`.
struct Bf16GemmPath {
  bool native = false;
  std::string why;
};
Bf16GemmPath bf16_gemm_path();
}
