#include "kernels/cpu/scratch.h"

#include <cstdlib>
#include <cstring>
#include <new>

namespace fab::cpu {

ScratchBuffer::ScratchBuffer(size_t count) {
  size_t bytes = (count * sizeof(float) + 63) / 64 * 64;
  data_ = static_cast<float*>(std::aligned_alloc(64, bytes == 0 ? 64 : bytes));
  if (!data_) throw std::bad_alloc();
  std::memset(data_, 0, bytes);
}

ScratchBuffer::~ScratchBuffer() { std::free(data_); }

}  // namespace fab::cpu
