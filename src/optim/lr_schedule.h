#pragma once
// Learning-rate schedules exactly as transformers' get_scheduler (the names LLaMA-Factory's
// lr_scheduler_type accepts). Step s is the 0-based optimizer step: as with HF's Trainer, the
// first update uses multiplier(0), which is 0 during warmup.
#include <cstdint>
#include <string>

namespace fab {

struct LrSchedule {
  std::string type = "linear";  // linear | cosine | cosine_with_restarts | polynomial | constant |
                                // constant_with_warmup | inverse_sqrt | cosine_with_min_lr |
                                // warmup_stable_decay
  double base_lr = 5e-5;
  int64_t warmup_steps = 0;
  int64_t total_steps = 0;
  double num_cycles = -1;     // cosine: 0.5, cosine_with_restarts: 1 when left at -1
  double power = 1.0;         // polynomial
  double lr_end = 1e-7;       // polynomial
  double min_lr_rate = 0.0;   // cosine_with_min_lr
  int64_t num_stable_steps = 0, num_decay_steps = 0;  // warmup_stable_decay
  double min_lr_ratio = 0.0;  // warmup_stable_decay

  // lr / base_lr at step s; throws UserError for an unknown type.
  double multiplier(int64_t step) const;
  double lr(int64_t step) const { return base_lr * multiplier(step); }
};

// Validates the type name (with the list of known names in the message).
void check_lr_schedule(const LrSchedule& schedule);

}  // namespace fab
