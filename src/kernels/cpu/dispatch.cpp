// Picks the CPU kernel table once, at run time: the binary carries AVX-512 and AVX2 builds of
// the same sources and runs on any x86-64 CPU with AVX2.
#include <cstdlib>
#include <string_view>

#include "core/error.h"
#include "kernels/cpu/matmul_onednn.h"
#include "kernels/kernel_table.h"

#define FAB_ISA avx512
#include "kernels/cpu/isa_kernels.h"
#undef FAB_ISA
#define FAB_ISA avx2
#include "kernels/cpu/isa_kernels.h"
#undef FAB_ISA

namespace fab {
namespace {

#define FAB_KERNEL_TABLE(ns)                                                                                  \
  KernelTable {                                                                                               \
    #ns, cpu::matmul, cpu::ns::embedding_forward, cpu::ns::embedding_backward, cpu::ns::rmsnorm_forward,     \
        cpu::ns::rmsnorm_backward, cpu::ns::rope_forward, cpu::ns::rope_backward, cpu::ns::attention_forward, \
        cpu::ns::attention_backward, cpu::ns::attention_decode, cpu::ns::swiglu_forward, cpu::ns::swiglu_backward,                       \
        cpu::ns::cross_entropy_chunk, cpu::ns::copy_2d, cpu::ns::add, cpu::ns::accumulate, cpu::ns::add_bias,                   \
        cpu::ns::bias_backward, cpu::ns::scale, cpu::ns::sum_squares, cpu::ns::to_bf16, cpu::ns::adamw_step   \
  }

bool cpu_has_avx512() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}

const KernelTable avx512_table = FAB_KERNEL_TABLE(avx512);
const KernelTable avx2_table = FAB_KERNEL_TABLE(avx2);

bool cpu_has_avx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

const KernelTable& choose() {
  // FAB_CPU_ISA=avx2 forces the fallback (tests run both on AVX-512 machines).
  const char* forced = std::getenv("FAB_CPU_ISA");
  if (forced && std::string_view(forced) == "avx2") return avx2_table;
  if (forced && std::string_view(forced) == "avx512") {
    FAB_USER_CHECK(cpu_has_avx512(), "FAB_CPU_ISA=avx512 but this CPU lacks AVX-512");
    return avx512_table;
  }
  if (cpu_has_avx512()) return avx512_table;
  FAB_USER_CHECK(cpu_has_avx2(), "Fabrica needs an x86-64 CPU with AVX2 and FMA");
  return avx2_table;
}

}  // namespace

const KernelTable* cpu_kernels_for_isa(const char* isa) {
  const std::string_view name = isa;
  if (name == "avx512") return cpu_has_avx512() ? &avx512_table : nullptr;
  if (name == "avx2") return cpu_has_avx2() ? &avx2_table : nullptr;
  return nullptr;
}

const KernelTable& cpu_kernels() {
  static const KernelTable& table = choose();
  return table;
}

}  // namespace fab
