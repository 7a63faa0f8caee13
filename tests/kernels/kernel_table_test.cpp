// Every slot of both CPU kernel tables is filled (the build also static_asserts it).
#include <gtest/gtest.h>

#include <string>

#include "kernels/kernel_table.h"

namespace fab {
namespace {

TEST(KernelTable, CpuTablesHaveNoEmptySlot) {
  std::string missing_isas;
  for (const char* isa : {"avx512", "avx2"}) {
    const KernelTable* table = cpu_kernels_for_isa(isa);
    if (table == nullptr) {
      missing_isas += std::string(" ") + isa;
      continue;
    }
    const char* empty = empty_kernel_slot(*table);
    EXPECT_EQ(empty, nullptr) << isa << " table: slot " << (empty ? empty : "") << " is empty";
    EXPECT_STREQ(table->isa, isa);
  }
  if (!missing_isas.empty()) GTEST_SKIP() << "this CPU cannot run:" << missing_isas << " [needs: avx512]";
}

TEST(KernelTable, EmptySlotIsNamed) {
  KernelTable table = cpu_kernels();
  table.rope_backward = nullptr;
  EXPECT_STREQ(empty_kernel_slot(table), "rope_backward");
}

}  // namespace
}  // namespace fab
