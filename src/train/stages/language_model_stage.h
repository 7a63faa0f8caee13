#pragma once
// stage pt and sft: the mean next-token cross-entropy over the targets of the whole global step
// (every micro-batch, every data-parallel rank), as Hugging Face normalises it
// (num_items_in_batch), so gradient accumulation and data parallelism both equal one big batch.
#include "train/stages/stage.h"

namespace fab {

class LanguageModelStage final : public TrainingStage {
 public:
  explicit LanguageModelStage(const StageContext& context);
  int64_t items() const override { return c_.data.train.size(); }
  StepResult step(int64_t step, double lr, Sampler& sampler) override;
  double evaluate() override;
  bool token_loss() const override { return true; }
  // Mixture-of-experts models: the window's mean load-balancing loss (aux_loss, apart from the
  // cross-entropy in loss), moe_load_max_over_mean and, with moe_z_loss_coeff, z_loss.
  nlohmann::json metrics(bool evaluated) override;

 private:
  void record_router_statistics();
  StageContext c_;
  double aux_coef_ = 0;  // the load-balancing loss's weight (0: not in the objective)
  StageMetrics router_{{"aux_loss", "moe_load_max_over_mean", "z_loss"}};
  RouterOptions router_options_;  // from the config (z_weight set per step)
};

}  // namespace fab
