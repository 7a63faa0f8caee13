#pragma once
// stage pt and sft: the mean next-token cross-entropy over the targets of the whole global step
// (every micro-batch, every data-parallel rank), as Hugging Face normalises it
// (num_items_in_batch), so gradient accumulation and data parallelism both equal one big batch.
#include "train/stages/stage.h"

namespace fab {

class LanguageModelStage final : public TrainingStage {
 public:
  explicit LanguageModelStage(const StageContext& context) : c_(context) {}
  int64_t items() const override { return c_.data.train.size(); }
  StepResult step(int64_t step, double lr, Sampler& sampler) override;
  double evaluate() override;
  bool token_loss() const override { return true; }

 private:
  StageContext c_;
};

}  // namespace fab
