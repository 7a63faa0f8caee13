#include "train/stages/stage.h"

#include "train/stages/language_model_stage.h"
#include "train/stages/ppo_stage.h"
#include "train/stages/preference_stage.h"
#include "train/stages/rollout_stage.h"

namespace fab {

std::unique_ptr<TrainingStage> make_training_stage(const StageContext& c) {
  switch (c.config.stage) {
    case Stage::pt:
    case Stage::sft:
      return std::make_unique<LanguageModelStage>(c);
    case Stage::rm:
    case Stage::dpo:
    case Stage::kto: {
      const TrainData& d = c.data;
      const StageData data{&d.train,  &d.eval,         &d.train_desirable, &d.eval_desirable,
                           d.pad_id, &d.train_images, &d.eval_images};
      return std::make_unique<PreferenceStage>(c, make_preference_objective(c.config, data));
    }
    case Stage::grpo:
      return std::make_unique<GrpoStage>(c);
    case Stage::ppo:
      return std::make_unique<PpoStage>(c);
  }
  return nullptr;
}

uint64_t dropout_seed(const TrainConfig& config, int rank, int64_t pass) {
  return (uint64_t(config.seed) * 1000003u + uint64_t(rank)) * 0x100000001b3ull + uint64_t(pass);
}

}  // namespace fab
