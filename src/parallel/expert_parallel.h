#pragma once
// Expert parallel's layout: which sizes it needs. The token exchange itself is nn/expert_exchange.h.

#include <cstdint>

#include "models/model_config.h"
#include "parallel/mesh.h"

namespace fab {

// expert_parallel_size folded into the data-parallel dimension (Megatron's parallel folding): ep
// consecutive data-parallel ranks form an expert-parallel group, so ep must divide dp and the
// experts. UserErrors name the sizes; ep with tensor or pipeline parallel, on a device, or on a
// model without experts is refused.
void check_expert_parallel(int64_t ep, const ModelConfig& model, const ParallelSizes& sizes, bool on_host);

}  // namespace fab
