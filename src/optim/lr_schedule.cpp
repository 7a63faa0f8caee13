#include "optim/lr_schedule.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace fab {
namespace {

constexpr double kPi = 3.14159265358979323846;
constexpr const char* kKnownTypes[] = {"linear",       "cosine",      "cosine_with_restarts", "polynomial",
                                       "constant",     "constant_with_warmup", "inverse_sqrt",
                                       "cosine_with_min_lr", "warmup_stable_decay"};

double warmup(int64_t step, int64_t warmup_steps) {
  return double(step) / double(std::max<int64_t>(1, warmup_steps));
}

double progress(const LrSchedule& s, int64_t step) {
  return double(step - s.warmup_steps) / double(std::max<int64_t>(1, s.total_steps - s.warmup_steps));
}

double warmup_stable_decay(const LrSchedule& s, int64_t step) {
  const double floor = s.min_lr_ratio;
  if (step < s.warmup_steps) return std::max(0.0, warmup(step, s.warmup_steps) * (1.0 - floor) + floor);
  if (step < s.warmup_steps + s.num_stable_steps) return 1.0;
  if (step < s.warmup_steps + s.num_stable_steps + s.num_decay_steps) {
    const double p = double(step - s.warmup_steps - s.num_stable_steps) /
                     double(std::max<int64_t>(1, s.num_decay_steps));
    const double cycles = s.num_cycles < 0 ? 0.5 : s.num_cycles;
    const double factor = 0.5 * (1.0 + std::cos(kPi * cycles * 2.0 * p));  // decay_type "cosine"
    return std::max(0.0, factor * (1.0 - floor) + floor);
  }
  return floor;
}

}  // namespace

void check_lr_schedule(const LrSchedule& s) {
  std::string known;
  for (const char* name : kKnownTypes) {
    if (s.type == name) return;
    known += (known.empty() ? "" : ", ") + std::string(name);
  }
  throw UserError(format("lr_scheduler_type \"{}\" is not supported (expected one of: {})", s.type, known));
}

double LrSchedule::multiplier(int64_t step) const {
  check_lr_schedule(*this);
  if (type == "constant") return 1.0;
  if (type == "warmup_stable_decay") return warmup_stable_decay(*this, step);
  if (step < warmup_steps) return warmup(step, warmup_steps);
  if (type == "constant_with_warmup") return 1.0;
  if (type == "linear")
    return std::max(0.0, double(total_steps - step) / double(std::max<int64_t>(1, total_steps - warmup_steps)));
  if (type == "cosine") {
    const double cycles = num_cycles < 0 ? 0.5 : num_cycles;
    return std::max(0.0, 0.5 * (1.0 + std::cos(kPi * cycles * 2.0 * progress(*this, step))));
  }
  if (type == "cosine_with_min_lr") {
    const double cycles = num_cycles < 0 ? 0.5 : num_cycles;
    const double factor = 0.5 * (1.0 + std::cos(kPi * cycles * 2.0 * progress(*this, step)));
    return std::max(0.0, factor * (1.0 - min_lr_rate) + min_lr_rate);
  }
  if (type == "cosine_with_restarts") {
    const double cycles = num_cycles < 0 ? 1.0 : num_cycles, p = progress(*this, step);
    if (p >= 1.0) return 0.0;
    return std::max(0.0, 0.5 * (1.0 + std::cos(kPi * std::fmod(cycles * p, 1.0))));
  }
  if (type == "polynomial") {
    if (step > total_steps) return lr_end / base_lr;
    const double decay_steps = double(total_steps - warmup_steps);
    const double remaining = 1.0 - double(step - warmup_steps) / decay_steps;
    return ((base_lr - lr_end) * std::pow(remaining, power) + lr_end) / base_lr;
  }
  // inverse_sqrt with transformers' default timescale (num_warmup_steps, or 10000 without warmup)
  const double timescale = warmup_steps ? double(warmup_steps) : 10000.0;
  return 1.0 / std::sqrt((double(step) + timescale - double(warmup_steps)) / timescale);
}

}  // namespace fab
