#pragma once
// Releasable device memory (Backend::releasable_zeros, decommit, commit) for the flat parameter
// and gradient buffers: one reserved virtual address range per buffer, backed by physical
// granules (2 MiB on current GPUs) that commit maps and decommit unmaps, through CUDA's virtual
// memory management (cuMemAddressReserve / cuMemCreate / cuMemMap). The addresses never change,
// so the model's views into a buffer stay valid while ZeRO-2/3 hand parts of it back -- what page
// mappings do on the host. The driver functions are looked up at run time
// (cudaGetDriverEntryPointByVersion), so the binary does not link libcuda and still starts on a
// machine without a driver.
//
// Mapped granules are counted in the allocator's live bytes (category of the buffer), so the
// device peak memory the trainer reports includes what ZeRO released.
//
// FAB_CUDA_VMM=0 (or a driver without these functions, said once on stderr) makes the buffers
// plain allocator memory: decommit then only zeroes, so ZeRO-2/3 stay right but release nothing.
#include <cstddef>

#include "core/tensor.h"
#include "kernels/cuda/cuda_allocator.h"

namespace fab::cuda {

// A zero-filled buffer, every granule mapped.
// `accounting` counts the mapped granules, and gives its cached blocks back when the device is full.
Tensor releasable_zeros(int64_t numel, DType dtype, MemoryCategory category, CudaAllocator& accounting);
// The whole granules inside [data, data + bytes) are unmapped (after the stream's queued work
// is done), the partial ones at its ends zeroed in place.
void decommit(void* data, size_t bytes);
// Maps and zero-fills the unmapped granules overlapping [data, data + bytes).
void commit(void* data, size_t bytes);
size_t resident_bytes(const void* data, size_t bytes);

}  // namespace fab::cuda
