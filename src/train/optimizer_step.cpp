#include "train/optimizer_step.h"

#include <cmath>
#include <cstdio>
#include <vector>

#include "core/error.h"

namespace fab {

OptimizerStep::OptimizerStep(const TrainConfig& config, const TrainerState& state, std::string prefix)
    : config_(config), state_(state), prefix_(std::move(prefix)) {}

UpdateResult OptimizerStep::apply(ParallelModel& model, int64_t step, double loss_sum, double lr,
                                  const UpdateRule& rule) {
  Communicator& group = model.data_group();
  model.finish_gradients();
  // The loss sum, then one flag per rank: its own loss sum is not finite. The loss is a pipeline's
  // last stage's; every stage learns it (and any stage's flag). Tensor-parallel peers hold the same.
  std::vector<double> sums(size_t(1 + group.size()), 0.0);
  sums[0] = loss_sum;
  sums[size_t(1 + group.rank())] = double(!std::isfinite(loss_sum));
  model.sum_over_data(sums.data(), int64_t(sums.size()), "loss");
  model.sum_over_stages(sums.data(), int64_t(sums.size()), "loss");
  UpdateResult out;
  out.loss_sum = sums[0];
  std::string ranks;
  for (int r = 0; r < group.size(); ++r)
    if (sums[size_t(1 + r)] > 0) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  const bool main = model.is_main();
  if (!ranks.empty()) {
    skip_or_stop(step, format("{} is not finite on rank {}", rule.loss, ranks), rule, main);
    out.skipped = true;
    return out;
  }
  out.grad_norm = model.data_parallel().clip_grad_norm(rule.max_grad_norm);
  if (!std::isfinite(out.grad_norm)) {
    skip_or_stop(step, format("{} (of the gradients summed over every rank) is {}", rule.gradient,
                              std::isnan(out.grad_norm) ? "NaN" : "infinite"),
                 rule, main);
    out.skipped = true;
    return out;
  }
  model.data_parallel().optimizer_step(float(lr));
  return out;
}

void OptimizerStep::skip_or_stop(int64_t step, const std::string& what, const UpdateRule& rule, bool main) {
  const std::string last = latest_checkpoint(config_.output_dir);
  const std::string kept = last.empty() ? "no checkpoint was saved before it" : "the last checkpoint is " + last;
  FAB_USER_CHECK(config_.nan_policy == "skip", "{}step {}: {}: stopping, saving nothing new (nan_policy: stop); {}. {}",
                 prefix_, step + 1, what, kept, rule.advice);
  const int64_t skipped = 1 + state_.skipped_steps();  // this step counts once, however many updates it skips
  FAB_USER_CHECK(skipped <= config_.max_skipped_steps,
                 "{}step {}: {}: {} optimizer steps skipped, more than max_skipped_steps {}: stopping, saving nothing "
                 "new; {}",
                 prefix_, step + 1, what, skipped, config_.max_skipped_steps, kept);
  skipped_in_step_ = true;
  if (main)
    std::printf("%sstep %lld: %s: optimizer step skipped (nan_policy: skip, %lld of at most %lld)\n", prefix_.c_str(),
                (long long)(step + 1), what.c_str(), (long long)skipped, (long long)config_.max_skipped_steps);
}

bool OptimizerStep::take_skipped() { return std::exchange(skipped_in_step_, false); }

}  // namespace fab
