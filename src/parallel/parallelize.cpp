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
  return share;
}

ParallelModel parallelize(DecoderModel& model, DeviceMesh& mesh, const TrainConfig& config) {
  ParallelModel out;
  const ParallelSizes& sizes = mesh.sizes();
  FAB_CHECK((sizes.tp > 1) == (model.sharding().size() > 1), "the model and the mesh disagree on tensor parallel");
  FAB_CHECK((sizes.pp > 1) == !model.is_whole(), "the model and the mesh disagree on pipeline stages");
  DataParallelOptions dp;
  dp.zero_stage = int(config.zero_stage);
  dp.bucket_bytes = int64_t(config.ddp_bucket_size * double(1 << 20));
  dp.adamw = AdamWConfig{float(config.adam_beta1), float(config.adam_beta2), float(config.adam_epsilon),
                         float(config.weight_decay)};
  if (sizes.tp > 1) {  // 1. the slices' norm: summed over tp, replicated tensors counted once
    out.tp = &mesh.group("tp");
    dp.model_parallel_groups.push_back(out.tp);
    dp.not_counted = ranges_counted_elsewhere(model);
  }
  if (sizes.pp > 1) {  // 2. the stage's executor; the norm summed over the stages, a tied copy counted once
    FAB_USER_CHECK(model.params().numel() > 0,
                   "pipeline stage {} holds no trainable parameter (finetuning_type freeze trains none of its layers): "
                   "choose freeze_trainable_layers / freeze_extra_modules that reach every stage, or fewer stages",
                   mesh.coordinate("pp"));
    out.pipeline = std::make_unique<PipelineParallel>(model, mesh.group("pp"), int(config.virtual_pipeline_parallel_size));
    dp.model_parallel_groups.push_back(&out.pipeline->group());
    dp.not_counted = merge_ranges(dp.not_counted, out.pipeline->norm_counted_elsewhere());
  }
  // 3. recompute is the model's own (DecoderOptions::recompute_layers). 4. data parallel / ZeRO:
  dp.device_group = mesh.device_group("dp");
  out.dp = std::make_unique<DataParallel>(model, mesh.group("dp"), dp);
  return out;
}

}  // namespace fab
