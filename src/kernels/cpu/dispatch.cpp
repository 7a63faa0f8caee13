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

#define FAB_KERNEL_TABLE(ns)                                                                                   \
  KernelTable{.isa = #ns, .matmul = cpu::matmul, .embedding_forward = cpu::ns::embedding_forward,            \
    .embedding_backward = cpu::ns::embedding_backward, .rmsnorm_forward = cpu::ns::rmsnorm_forward,            \
    .rmsnorm_backward = cpu::ns::rmsnorm_backward, .rope_forward = cpu::ns::rope_forward,                      \
    .rope_backward = cpu::ns::rope_backward, .attention_forward = cpu::ns::attention_forward,                  \
    .attention_backward = cpu::ns::attention_backward, .attention_decode = cpu::ns::attention_decode,          \
    .decode_matmul = cpu::ns::decode_matmul, .sampling_weights = cpu::ns::sampling_weights,                     \
    .swiglu_forward = cpu::ns::swiglu_forward, .swiglu_backward = cpu::ns::swiglu_backward,                    \
    .cross_entropy_chunk = cpu::ns::cross_entropy_chunk, .vocab_slice_max = cpu::ns::vocab_slice_max,         \
    .vocab_slice_exp = cpu::ns::vocab_slice_exp, .vocab_slice_grad = cpu::ns::vocab_slice_grad, .copy_2d = cpu::ns::copy_2d, .add = cpu::ns::add,     \
    .multiply = cpu::ns::multiply, .accumulate = cpu::ns::accumulate, .add_bias = cpu::ns::add_bias, .bias_backward = cpu::ns::bias_backward, \
    .scale = cpu::ns::scale, .sum_squares = cpu::ns::sum_squares, .to_bf16 = cpu::ns::to_bf16,                 \
    .dropout_mask = cpu::ns::dropout_mask, .adamw_step = cpu::ns::adamw_step}

bool cpu_has_avx512() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}

constexpr KernelTable avx512_table = FAB_KERNEL_TABLE(avx512);
constexpr KernelTable avx2_table = FAB_KERNEL_TABLE(avx2);
static_assert(empty_kernel_slot(avx512_table) == nullptr, "the AVX-512 kernel table leaves a slot empty");
static_assert(empty_kernel_slot(avx2_table) == nullptr, "the AVX2 kernel table leaves a slot empty");

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
