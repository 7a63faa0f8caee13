// No include guard: dispatch.cpp includes this once per instruction set.
// Declarations of the CPU kernels compiled once per instruction set. The sources in this folder
// are built twice, with FAB_ISA defined as avx512 and as avx2 (and the matching -m flags);
// dispatch.cpp includes this header for each and picks one table at run time.
#include "kernels/kernel_table.h"

#ifndef FAB_ISA
#error "FAB_ISA must name the instruction set these kernels are compiled for"
#endif

namespace fab::cpu::FAB_ISA {

#include "kernels/kernel_functions.inc"

}  // namespace fab::cpu::FAB_ISA
