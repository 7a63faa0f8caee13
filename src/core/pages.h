#pragma once
// Page-granular host memory for the flat parameter and gradient buffers: zero-filled anonymous
// mappings whose pages can be handed back to the OS and come back as zeros when touched again.
// ZeRO-3 keeps a layer's parameters resident only while the layer runs; ZeRO-2/3 drop gradient
// pages once they are reduced. resident_bytes() measures what is really held (mincore).
#include <cstddef>

#include "core/tensor.h"

namespace fab {

// A zero-filled tensor of `numel` elements in its own mapping, accounted under `category` for
// its full size.
Tensor mapped_zeros(int64_t numel, DType dtype, MemoryCategory category);

// Afterwards [data, data + bytes) reads as zeros; the whole pages inside it go back to the OS,
// the partial pages at its ends are zeroed in place. `data` must lie in a mapped_zeros tensor.
void zero_and_release(void* data, size_t bytes);

// Bytes of the pages overlapping [data, data + bytes) that are resident in memory.
size_t resident_bytes(const void* data, size_t bytes);

// This process's resident memory now (VmRSS) and at its peak (getrusage's ru_maxrss), in bytes.
double process_resident_bytes();
double process_peak_resident_bytes();

}  // namespace fab
