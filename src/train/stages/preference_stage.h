#pragma once
// stage dpo, kto and rm: a loss per item (a chosen/rejected pair; kto's example), its objective in
// preference_objective.h, normalised over the items of the whole global step.
#include <memory>

#include "train/stages/preference_objective.h"
#include "train/stages/stage.h"

namespace fab {

class PreferenceStage final : public TrainingStage {
 public:
  PreferenceStage(const StageContext& context, std::unique_ptr<PreferenceObjective> objective);
  int64_t items() const override { return objective_->items(c_.data.train); }
  void prepare() override;
  StepResult step(int64_t step, double lr, Sampler& sampler) override;
  double evaluate() override;
  nlohmann::json metrics(bool evaluated) override;

 private:
  StageContext c_;
  std::unique_ptr<PreferenceObjective> objective_;
  StageMetrics train_metrics_, eval_metrics_;
};

}  // namespace fab
