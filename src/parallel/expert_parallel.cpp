#include "parallel/expert_parallel.h"

#include "core/error.h"

namespace fab {

void check_expert_parallel(int64_t ep, const ModelConfig& model, const ParallelSizes& sizes, bool on_host) {
  if (ep == 1) return;
  FAB_USER_CHECK(ep > 1, "expert_parallel_size {} must be at least 1", ep);
  FAB_USER_CHECK(model.is_moe(), "expert_parallel_size {} needs a mixture-of-experts model ({} has no experts)", ep,
                 model.model_type);
  FAB_USER_CHECK(model.moe.num_experts % ep == 0, "expert_parallel_size {} does not divide the {} experts of {}", ep,
                 model.moe.num_experts, model.model_type);
  FAB_USER_CHECK(sizes.dp % ep == 0,
                 "expert_parallel_size {} does not divide the {} data-parallel ranks (expert parallel is folded into "
                 "data parallel)",
                 ep, sizes.dp);
  FAB_USER_CHECK(sizes.tp == 1 && sizes.pp == 1,
                 "expert_parallel_size {} with tensor_parallel_size {} / pipeline_parallel_size {} is not implemented "
                 "in Fabrica yet",
                 ep, sizes.tp, sizes.pp);
  FAB_USER_CHECK(on_host, "expert_parallel_size {} on a device (NCCL all_to_all) is not implemented in Fabrica yet", ep);
}

}  // namespace fab
