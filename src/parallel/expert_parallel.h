#pragma once
// Expert parallel's layout: which sizes it needs, where this rank's experts sit in the flat
// buffers, and the whole experts gathered for a save. The token exchange itself is
// nn/expert_exchange.h.

#include <cstdint>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "io/safetensors.h"
#include "models/decoder.h"
#include "models/model_config.h"
#include "parallel/mesh.h"

namespace fab {

// expert_parallel_size folded into the data-parallel dimension (Megatron's parallel folding): ep
// consecutive ranks of the group gradients are reduced over (dp, or dp x cp under context
// parallel) form an expert-parallel group, so ep must divide it and the experts. UserErrors name
// the sizes; ep with tensor or pipeline parallel, on a device, or on a model without experts is
// refused.
void check_expert_parallel(int64_t ep, const ModelConfig& model, const ParallelSizes& sizes, bool on_host);

// Flat-buffer ranges of the trainable parameters (ascending, disjoint) holding the experts of
// each MoE layer this rank holds: one range a layer (its gate/up block, then its down block).
std::vector<std::pair<int64_t, int64_t>> expert_ranges(const DecoderModel& model);

// Every base parameter of a model that holds E/ep experts, as Hugging Face names and shapes it:
// each MoE layer's experts gathered over the expert-parallel `group` (rank r holds experts
// [r E/ep, (r+1) E/ep)), the rest as this rank holds it, on the rank that writes them (`main`;
// the others get none). Collective over the group.
std::vector<NamedTensor> gather_expert_weights(const DecoderModel& model, Communicator& group, bool main);

}  // namespace fab
