#pragma once
#include "kernels/kernel_table.h"

namespace fab::cpu {
void matmul(const MatmulArgs& args);
}
