#include "parallel/parallelize.h"

#include "core/error.h"

namespace fab {

ModelShare model_share(DecoderOptions base, const ParallelLayout& layout, DeviceMesh& mesh,
                       const TrainConfig& config) {
  ModelShare share;
  share.options = std::move(base);
  if (layout.tp > 1) {  // 1. tensor parallel
    share.tp = std::make_unique<TensorParallel>(mesh.group("tp"), layout.sequence_parallel, mesh.device_group("tp"));
    share.options.sharding = share.tp.get();
  }
  if (layout.pp > 1)  // 2. pipeline parallel
    share.options.stage = pipeline_stage(layout.chunk_layers, layout.pp, mesh.coordinate("pp"));
  share.options.recompute_layers = config.recompute_layers;  // 3. recompute
  if (config.expert_parallel_size > 1) {  // 4. expert parallel, folded into data parallel
    const int ep = int(config.expert_parallel_size);
    share.options.experts = ExpertShare{ep, mesh.group(layout.cp > 1 ? "cp-dp" : "dp").rank() % ep};
  }
  return share;
}

std::unique_ptr<ParallelModel> parallelize(std::unique_ptr<DecoderModel> model, DeviceMesh* mesh,
                                           const TrainConfig& config) {
  return std::make_unique<ParallelModel>(std::move(model), mesh, config);
}

}  // namespace fab
