// fabrica_gpu_tests: on a machine without a usable GPU it says so and exits 77, which CTest counts
// as skipped (SKIP_RETURN_CODE); FAB_REQUIRE_GPU=1 turns that into a failure (scripts/gpu_check.sh
// sets it on the GPU machine).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>

#include "core/backend.h"

int main(int argc, char** argv) {
  const fab::Backend& cuda = fab::backend(fab::DeviceKind::cuda);
  std::printf("fabrica_gpu_tests: %s\n", cuda.name().c_str());
  if (!cuda.available()) {
    const char* require = std::getenv("FAB_REQUIRE_GPU");
    const bool required = require && *require && *require != '0';
    std::printf("fabrica_gpu_tests: SKIPPED, no usable CUDA device (%s) [needs: gpu]\n", required ? "FAB_REQUIRE_GPU is set: failing" : "nothing to test here");
    return required ? 1 : 77;
  }
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
