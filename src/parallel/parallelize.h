#pragma once
// The one place that applies the parallel strategies to the single-device decoder, from outside
// and always in this order:
//   1. tensor parallel: the model registers this rank's slices (ShardSpec) and calls
//      TensorParallel over the mesh's "tp" group where they meet (DecoderOptions::sharding);
//   2. pipeline parallel: the model holds this rank's stage, the layout's chunks for its "pp"
//      coordinate (DecoderOptions::stage), and PipelineParallel runs the schedule over "pp";
//   3. recompute: activation checkpointing of each layer this rank holds (recompute_layers);
//   4. expert parallel, folded into data parallel: the model holds the experts of its place in
//      its group of expert_parallel_size consecutive dp ranks (DecoderOptions::experts), and
//      exchanges its MoE layers' rows over that group (nn/expert_exchange.h);
//   5. data parallel and ZeRO: DataParallel over "dp" (the experts' gradients over the ranks
//      holding the same experts), the gradient norm summed over the model-parallel groups (tp,
//      then pp) and leaving out what another rank of them counts.
// Steps 1-4 decide what the model holds, so they come before it is built: model_share() gives the
// options to build it with. Step 2's executor, step 4's exchange and step 5 wrap the built model:
// parallelize(). No
// state is global: the mesh is passed in and the results hold every object.
#include <memory>

#include "config/train_config.h"
#include "models/decoder.h"
#include "parallel/data_parallel.h"
#include "parallel/layout.h"
#include "parallel/mesh.h"
#include "parallel/parallel_model.h"
#include "parallel/pipeline_parallel.h"
#include "parallel/tensor_parallel.h"

namespace fab {

// What this rank builds: `options` (base options with steps 1-3 applied) point at `tp`, which
// must outlive the model.
struct ModelShare {
  std::unique_ptr<TensorParallel> tp;
  DecoderOptions options;
};
ModelShare model_share(DecoderOptions base, const ParallelLayout& layout, DeviceMesh& mesh,
                       const TrainConfig& config);

// The built model wrapped (parallel/parallel_model.h): its pipeline (pp > 1) and its data
// parallelism. Collective over the mesh (nullptr: this process alone). `model` must have been
// built with model_share()'s options for this mesh (an error says what disagrees otherwise).
std::unique_ptr<ParallelModel> parallelize(std::unique_ptr<DecoderModel> model, DeviceMesh* mesh,
                                           const TrainConfig& config);

}  // namespace fab
