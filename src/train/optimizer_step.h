#pragma once
// The end of every optimizer update, the same for every stage (and for stage ppo's critic): the
// gradients reduced over the ranks, this update's loss and whether it is finite on each rank
// agreed, a non-finite loss or gradient norm skipped or stopping the run as nan_policy says,
// clipping by the global norm, and the AdamW step.
#include <cstdint>
#include <string>

#include "config/train_config.h"
#include "parallel/parallel_model.h"
#include "train/checkpoint.h"

namespace fab {

// What one kind of update clips to and calls things in its messages.
struct UpdateRule {
  double max_grad_norm = 1.0;
  std::string loss = "the loss";                // "the critic's value loss"
  std::string gradient = "the gradient norm";  // "the critic's gradient norm"
  std::string advice = "Lower learning_rate, check the data, or set nan_policy: skip";
};

struct UpdateResult {
  double loss_sum = 0;    // over the data-parallel ranks (and a pipeline's stages)
  double grad_norm = NAN;  // NaN when the update was skipped before clipping
  bool skipped = false;
};

class OptimizerStep {
 public:
  // `state` counts the steps skipped so far (its losses); `prefix` begins every message
  // ("stage grpo: " where the stage is not in the step's words already).
  OptimizerStep(const TrainConfig& config, const TrainerState& state, std::string prefix);

  // After this rank's backward of the update (`loss_sum`: its share of the loss): collective over
  // `model`'s ranks. A skipped update changes no weight; the step counts as skipped (its loss NaN).
  UpdateResult apply(ParallelModel& model, int64_t step, double loss_sum, double lr, const UpdateRule& rule);
  // Whether an update of the current step was skipped; clears it for the next step.
  bool take_skipped();

 private:
  // nan_policy: stop throws a UserError naming the step and what is not finite; skip prints a
  // line, unless more than max_skipped_steps steps would then be skipped (a UserError).
  void skip_or_stop(int64_t step, const std::string& what, const UpdateRule& rule, bool main);

  const TrainConfig& config_;
  const TrainerState& state_;
  std::string prefix_;
  bool skipped_in_step_ = false;
};

}  // namespace fab
