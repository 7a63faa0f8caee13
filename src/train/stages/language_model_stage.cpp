#include "train/stages/language_model_stage.h"

#include <algorithm>

#include "core/error.h"
#include "core/trace.h"
#include "train/batch.h"

namespace fab {
namespace {

MicroBatch micro_batch_of(const TokenSequences& set, const std::vector<int64_t>& samples, int32_t pad,
                          bool neat_packing, const std::vector<SequenceImages>& images) {
  trace::Scope traced(trace::kData, "collate");
  Batch b = collate(set, samples, pad, neat_packing, images);
  return {b.ids, b.labels, {b.positions, b.doc_start, b.pixel_values, b.image_grid_thw, b.lengths}};
}

// The targets and tokens of this rank's next `micro_batches` micro-batches, counted on a copy of
// the sampler: each batch is collated, counted and dropped, so memory holds one micro-batch
// however many the step accumulates.
std::pair<double, double> count_step(const Sampler& sampler, int64_t micro_batches, const TrainData& data,
                                     bool neat_packing) {
  trace::Scope traced(trace::kData, "count the step's targets");
  Sampler ahead = sampler;
  double targets = 0, tokens = 0;
  for (int64_t m = 0; m < micro_batches; ++m) {
    const Batch b = collate(data.train, ahead.next_batch(), data.pad_id, neat_packing);
    targets += double(DecoderModel::count_targets(b.labels));
    tokens += double(b.tokens);
  }
  return {targets, tokens};
}

}  // namespace

// The load-balancing loss joins the objective as transformers adds it when output_router_logits is
// on, at router_aux_loss_coef; LLaMA-Factory's moe_aux_loss_coef turns it on at that weight.
// moe_router_load_balancing_type switches to Megatron's per-layer / per-sequence forms (or none),
// with the same coefficient; moe_z_loss_coeff and moe_expert_capacity_factor are Megatron's.
LanguageModelStage::LanguageModelStage(const StageContext& context) : c_(context) {
  const TrainConfig& config = c_.config;
  const MoeConfig& moe = c_.model.model().config().moe;
  const std::string& type = config.moe_router_load_balancing_type;
  FAB_USER_CHECK(moe.enabled() || (type.empty() && config.moe_z_loss_coeff == 0 && config.moe_expert_capacity_factor == 0),
                 "moe_router_load_balancing_type, moe_z_loss_coeff and moe_expert_capacity_factor need a "
                 "mixture-of-experts model ({} has no experts)",
                 c_.model.model().config().model_type);
  if (!moe.enabled()) return;
  router_options_.balancing = type.empty()           ? LoadBalancing::transformers
                              : type == "aux_loss"     ? LoadBalancing::per_layer
                              : type == "seq_aux_loss" ? LoadBalancing::per_sequence
                                                       : LoadBalancing::none;
  router_options_.capacity_factor = config.moe_expert_capacity_factor;
  router_options_.drop_by_position = config.moe_token_drop_policy == "position";
  aux_coef_ = router_options_.balancing == LoadBalancing::none ? 0.0
              : config.moe_aux_loss_coef > 0                   ? config.moe_aux_loss_coef
              : moe.output_router_logits                       ? moe.router_aux_loss_coef
                                                               : 0.0;
  c_.model.model().set_router_options(router_options_);  // evaluation before the first step too
}

void LanguageModelStage::record_router_statistics() {
  if (!c_.model.model().config().is_moe()) return;
  const RouterStatistics& s = c_.model.model().router_statistics();
  router_.add(0, s.aux_loss);
  router_.add(1, s.load_max_over_mean);
  if (c_.config.moe_z_loss_coeff > 0) router_.add(2, s.z_loss);
}

nlohmann::json LanguageModelStage::metrics(bool) {
  if (!c_.model.model().config().is_moe()) return nlohmann::json::object();
  router_.all_reduce(c_.model.data_group());
  nlohmann::json j = nlohmann::json::object();
  for (size_t i = 0; i < router_.names().size(); ++i)
    if (router_.has(i)) j[router_.names()[i]] = router_.mean(i);
  router_.clear();
  return j;
}

// Micro-batches are collated when they run; the loss of each is normalised by the target count of
// the whole global step, summed over the ranks first (one small all-reduce before backward).
StepResult LanguageModelStage::step(int64_t step, double lr, Sampler& sampler) {
  const TrainConfig& config = c_.config;
  ParallelModel& model = c_.model;
  const int64_t micro_batches = config.gradient_accumulation_steps;
  const auto [my_targets, my_tokens] = count_step(sampler, micro_batches, c_.data, config.neat_packing);
  double counts[2] = {my_targets, my_tokens};
  model.sum_over_data(counts, 2, "target count");
  const double targets = counts[0];
  const float scale = targets > 0 ? float(1.0 / targets) : 0.0f;
  const int rank = model.data_group().rank();
  // Each micro-batch's load-balancing loss is computed over its own rows, as transformers does
  // per forward; the objective takes their mean over the step's micro-batches on every rank.
  const double per_micro_batch = 1.0 / double(micro_batches * model.data_group().size());
  model.model().set_aux_loss_weight(aux_coef_ * per_micro_batch);
  if (model.model().config().is_moe()) {  // the z-loss weighs in the same way
    RouterOptions router = router_options_;
    router.z_weight = config.moe_z_loss_coeff * per_micro_batch;
    model.model().set_router_options(router);
  }
  const double loss_sum = model.forward_backward(micro_batches, scale, [&](int64_t m) {
    if (m > 0) record_router_statistics();  // the previous micro-batch's
    model.model().set_dropout_seed(dropout_seed(config, rank, step * micro_batches + m));
    return micro_batch_of(c_.data.train, sampler.next_batch(), c_.data.pad_id, config.neat_packing,
                          c_.data.train_images);
  });
  record_router_statistics();
  const UpdateResult u = c_.optimizer.apply(model, step, loss_sum, lr, UpdateRule{config.max_grad_norm});
  StepResult out;
  out.tokens = int64_t(counts[1]);
  out.grad_norm = u.grad_norm;
  out.loss = u.skipped ? NAN : targets > 0 ? u.loss_sum / targets : 0.0;
  return out;
}

// Mean loss over the evaluation set (no gradients); each rank takes every N-th batch. Every rank
// runs the same number of forward passes (ZeRO-3 gathers parameters in each): one without a
// batch of its own in the last round runs a one-token pass with no target, which adds nothing.
double LanguageModelStage::evaluate() {
  const TokenSequences& eval = c_.data.eval;
  if (eval.size() == 0) return NAN;
  ParallelModel& model = c_.model;
  double sums[2] = {0, 0};  // loss, targets
  const int64_t batch = c_.config.per_device_eval_batch_size, ranks = model.data_group().size();
  const int64_t batches = (eval.size() + batch - 1) / batch, rounds = (batches + ranks - 1) / ranks;
  for (int64_t round = 0; round < rounds; ++round) {
    const int64_t start = (round * ranks + model.data_group().rank()) * batch;
    if (start >= eval.size()) {
      Tensor none = Tensor::zeros({1, 1}, DType::i64, MemoryCategory::activations);
      none.data<int64_t>()[0] = -100;
      model.loss_sum({Tensor::zeros({1, 1}, DType::i64, MemoryCategory::activations), none, {}});
      continue;
    }
    std::vector<int64_t> idx;
    for (int64_t i = start; i < std::min(eval.size(), start + batch); ++i) idx.push_back(i);
    const Batch b = collate(eval, idx, c_.data.pad_id, c_.config.neat_packing, c_.data.eval_images);
    sums[0] += model.loss_sum({b.ids, b.labels, {b.positions, b.doc_start, b.pixel_values, b.image_grid_thw}});
    sums[1] += double(DecoderModel::count_targets(b.labels));
  }
  model.data_parallel().release_gathered_parameters();
  model.sum_over_data(sums, 2, "evaluation loss");
  model.sum_over_stages(sums, 1, "evaluation loss");
  return sums[1] > 0 ? sums[0] / sums[1] : NAN;
}

}  // namespace fab
