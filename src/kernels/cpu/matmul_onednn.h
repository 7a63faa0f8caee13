#pragma once
#include <string>

#include "kernels/kernel_table.h"

namespace fab::cpu {
void matmul(const MatmulArgs& args);
// "oneDNN 2.6.3, ISA avx512_core_amx" for `fabrica env`.
std::string onednn_description();
}
