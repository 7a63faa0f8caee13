#pragma once
// Per-thread scratch floats for the per-ISA kernels. Defined out of line in a translation unit
// compiled for the baseline ISA, so no AVX-512 code can be shared into the AVX2 path.
#include <cstddef>

namespace fab::cpu {

class ScratchBuffer {
 public:
  explicit ScratchBuffer(size_t count);  // zero-filled
  ~ScratchBuffer();
  ScratchBuffer(const ScratchBuffer&) = delete;
  ScratchBuffer& operator=(const ScratchBuffer&) = delete;
  float* data() const { return data_; }

 private:
  float* data_;
};

}  // namespace fab::cpu
