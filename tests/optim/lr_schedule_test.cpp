// Every lr_scheduler_type against transformers' formulas (values in build/reference/schedules.json,
// written by tests/reference/make_reference.py and checked there against transformers itself).
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "optim/lr_schedule.h"
#include "test_util.h"

namespace fab {
namespace {

TEST(LrSchedule, EveryTypeMatchesTransformers) {
  std::ifstream in(test::reference_dir() + "/schedules.json");
  ASSERT_TRUE(in) << "missing schedules.json";
  nlohmann::json ref = nlohmann::json::parse(in);
  int checked = 0;
  for (auto& [type, entry] : ref["schedules"].items()) {
    LrSchedule s;
    s.type = type;
    s.base_lr = ref["base_lr"].get<double>();
    s.warmup_steps = ref["num_warmup_steps"].get<int64_t>();
    s.total_steps = ref["num_training_steps"].get<int64_t>();
    const auto& p = entry["params"];
    if (p.contains("num_cycles")) s.num_cycles = p["num_cycles"].get<double>();
    if (p.contains("power")) s.power = p["power"].get<double>();
    if (p.contains("lr_end")) s.lr_end = p["lr_end"].get<double>();
    if (p.contains("min_lr_rate")) s.min_lr_rate = p["min_lr_rate"].get<double>();
    if (p.contains("num_stable_steps")) s.num_stable_steps = p["num_stable_steps"].get<int64_t>();
    if (p.contains("num_decay_steps")) s.num_decay_steps = p["num_decay_steps"].get<int64_t>();
    if (p.contains("min_lr_ratio")) s.min_lr_ratio = p["min_lr_ratio"].get<double>();
    const auto& expected = entry["multipliers"];
    for (size_t step = 0; step < expected.size(); ++step)
      EXPECT_NEAR(s.multiplier(int64_t(step)), expected[step].get<double>(), 1e-12) << type << " step " << step;
    ++checked;
  }
  EXPECT_EQ(checked, 9);
}

TEST(LrSchedule, UnknownTypeIsAUserErrorListingTheKnownOnes) {
  LrSchedule s;
  s.type = "cosine_annealing";
  try {
    s.multiplier(0);
    FAIL() << "expected a UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("cosine_with_restarts"), std::string::npos) << e.what();
  }
  s.type = "sine";  // a substring of nothing, but check partial matches too
  EXPECT_THROW(s.multiplier(0), UserError);
  s.type = "cosine_with";
  EXPECT_THROW(s.multiplier(0), UserError);
}

}  // namespace
}  // namespace fab
