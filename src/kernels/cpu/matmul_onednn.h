#pragma once
#include <string>

#include "kernels/kernel_table.h"

namespace fab::cpu {
void matmul(const MatmulArgs& args);
// "oneDNN 2.6.3, ISA avx512_core_amx" for `fabrica env`.
std::string onednn_description();
// How bf16 GEMMs run on this CPU (oneDNN's bf16 matmul, or widened to f32), for `fabrica env`.
std::string bf16_gemm_description();
}
