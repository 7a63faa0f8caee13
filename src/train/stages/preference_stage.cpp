#include "train/stages/preference_stage.h"

#include <algorithm>

#include "core/trace.h"

namespace fab {

PreferenceStage::PreferenceStage(const StageContext& context, std::unique_ptr<PreferenceObjective> objective)
    : c_(context),
      objective_(std::move(objective)),
      train_metrics_(objective_->metric_names()),
      eval_metrics_(objective_->metric_names()) {}

// The reference is the starting weights: before a resume replaces them. A mixture-of-experts
// model's load-balancing loss is not part of these objectives: LLaMA-Factory's DPO, KTO and
// reward trainers take only the logits (or values) of the model's output, never its aux_loss.
void PreferenceStage::prepare() {
  if (c_.model.model().config().is_moe()) c_.model.model().set_aux_loss_weight(0.0);
  objective_->set_context_parallel(c_.model.context_parallel());
  objective_->prepare(c_.model.model(), c_.model.data_group());
  c_.model.data_parallel().release_gathered_parameters();
}

// The loss is a mean over the step's items on every rank: they are its targets.
StepResult PreferenceStage::step(int64_t step, double lr, Sampler& sampler) {
  const TrainConfig& config = c_.config;
  ParallelModel& model = c_.model;
  const int64_t micro_batches = config.gradient_accumulation_steps;
  double counts[2] = {0, 0};  // items, tokens
  {
    trace::Scope traced(trace::kData, "count the step's items");
    Sampler ahead = sampler;
    for (int64_t m = 0; m < micro_batches; ++m)
      for (int64_t item : ahead.next_batch()) {
        counts[0] += 1;
        counts[1] += double(c_.data.train.length(2 * item) + c_.data.train.length(2 * item + 1));
      }
  }
  model.sum_over_data(counts, 2, "target count");
  const float scale = counts[0] > 0 ? float(1.0 / counts[0]) : 0.0f;
  Communicator& group = model.data_group();
  const double loss_sum = model.accumulate(micro_batches, [&](int64_t m) {
    model.model().set_dropout_seed(dropout_seed(config, group.rank(), step * micro_batches + m));
    return objective_->step(model.model(), DataSplit::train, sampler.next_batch(), scale, true, train_metrics_, group);
  });
  const UpdateResult u = c_.optimizer.apply(model, step, loss_sum, lr, UpdateRule{config.max_grad_norm});
  return {u.skipped ? NAN : counts[0] > 0 ? u.loss_sum / counts[0] : 0.0, u.grad_norm, int64_t(counts[1])};
}

// The mean loss over the evaluation items and their metrics, the batches dealt to the ranks as
// the language-model stages deal them; a rank without a batch in the last round runs item 0 and
// drops the result.
double PreferenceStage::evaluate() {
  if (c_.data.eval.size() == 0) return NAN;
  ParallelModel& model = c_.model;
  Communicator& group = model.data_group();
  eval_metrics_.clear();
  StageMetrics dropped(objective_->metric_names());
  double sums[2] = {0, 0};  // loss, items
  const int64_t items = objective_->items(c_.data.eval), batch = c_.config.per_device_eval_batch_size;
  const int64_t ranks = group.size(), batches = (items + batch - 1) / batch, rounds = (batches + ranks - 1) / ranks;
  for (int64_t round = 0; round < rounds; ++round) {
    const int64_t start = (round * ranks + group.rank()) * batch;
    std::vector<int64_t> idx;
    for (int64_t i = start; i < std::min(items, start + batch); ++i) idx.push_back(i);
    const bool none = idx.empty();
    const double loss = objective_->step(model.model(), DataSplit::eval, none ? std::vector<int64_t>{0} : idx, 1.0f,
                                         false, none ? dropped : eval_metrics_, group);
    if (!none) sums[0] += loss, sums[1] += double(idx.size());
  }
  model.data_parallel().release_gathered_parameters();
  model.sum_over_data(sums, 2, "evaluation loss");
  eval_metrics_.all_reduce(group);
  return sums[1] > 0 ? sums[0] / sums[1] : NAN;
}

nlohmann::json PreferenceStage::metrics(bool evaluated) {
  train_metrics_.all_reduce(c_.model.data_group());
  nlohmann::json j = objective_->metrics_json(train_metrics_, "");
  train_metrics_.clear();
  if (evaluated) j.update(objective_->metrics_json(eval_metrics_, "eval_"));
  j.update(objective_->memory_json());
  return j;
}

}  // namespace fab
