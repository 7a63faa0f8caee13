// The preference stages against tests/reference/make_pref_reference.py (PyTorch autograd over the
// published formulas): 5 AdamW steps of every DPO loss, KTO and the reward model on one fixed
// batch of the reference's tiny Llama, losses within 1e-4 relative. The first DPO-sigmoid step,
// where the policy is the reference, is ln 2.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "io/safetensors.h"
#include "models/hf_model.h"
#include "parallel/data_parallel.h"
#include "train/stages/preference_objective.h"
#include "test_util.h"

namespace fab {
namespace {

struct PreferenceFixture {
  std::string dir = test::reference_dir() + "/pref";
  SafetensorsFile ref = SafetensorsFile::open(dir + "/reference.safetensors");
  TokenSequences rows, kto_rows, none;
  std::vector<uint8_t> desirable, no_tags;

  PreferenceFixture() {
    rows = sequences("");
    kto_rows = sequences("kto_");
    none = TokenSequencesBuilder().finish();
    const Tensor tags = ref.tensor("desirable");
    for (int64_t i = 0; i < tags.numel(); ++i) desirable.push_back(uint8_t(tags.data<int64_t>()[i]));
  }

  TokenSequences sequences(const std::string& prefix) const {
    const Tensor ids = ref.tensor(prefix + "ids"), labels = ref.tensor(prefix + "labels");
    const Tensor lengths = ref.tensor(prefix + "lengths");
    TokenSequencesBuilder b;
    const int64_t t = ids.dim(1);
    for (int64_t i = 0; i < ids.dim(0); ++i) {
      const int64_t n = lengths.data<int64_t>()[i];
      std::vector<int32_t> row_ids, row_labels;
      for (int64_t k = 0; k < n; ++k) {
        row_ids.push_back(int32_t(ids.data<int64_t>()[i * t + k]));
        row_labels.push_back(int32_t(labels.data<int64_t>()[i * t + k]));
      }
      b.add(row_ids, row_labels);
    }
    return b.finish();
  }

  nlohmann::json case_info(const std::string& name) const { return nlohmann::json::parse(ref.metadata().at(name)); }
};

// The case's stage and settings as a run config.
TrainConfig config_of(const nlohmann::json& info) {
  std::string yaml = "stage: " + info["stage"].get<std::string>() + "\noutput_dir: unused\n";
  for (const auto& [key, value] : info["settings"].items()) yaml += key + ": " + value.dump() + "\n";
  return parse_train_config(yaml, "pref.yaml");
}

// The 5 losses Fabrica computes for the case: prepare (the reference), then per step one
// micro-batch of every item, the loss a mean over items, and AdamW as torch's defaults.
std::vector<double> fabrica_losses(const PreferenceFixture& f, const std::string& name) {
  const TrainConfig c = config_of(f.case_info(name));
  DecoderOptions options;
  options.value_head = c.stage == Stage::rm;
  auto model = load_model_folder(f.dir, options);
  LocalCommunicator group;
  DataParallelOptions dp_options;
  dp_options.adamw = AdamWConfig{0.9f, 0.999f, 1e-8f, 0.0f};
  DataParallel dp(*model, group, dp_options);
  const StageData data{c.stage == Stage::kto ? &f.kto_rows : &f.rows, &f.none, &f.desirable, &f.no_tags, 0};
  auto objective = make_preference_objective(c, data);
  objective->prepare(*model, group);
  StageMetrics metrics(objective->metric_names());
  const std::vector<int64_t> items = {0, 1, 2, 3};
  std::vector<double> losses;
  for (int step = 0; step < 5; ++step) {
    dp.begin_step(1);
    dp.begin_micro_batch(0);
    const double sum = objective->step(*model, DataSplit::train, items, 1.0f / 4, true, metrics, group);
    dp.finish_gradients();
    dp.optimizer_step(1e-3f);
    losses.push_back(sum / 4);
  }
  return losses;
}

class PreferenceReference : public ::testing::TestWithParam<std::string> {};

TEST_P(PreferenceReference, FiveStepsMatchPyTorch) {
  if (!std::filesystem::exists(test::reference_dir() + "/pref/reference.safetensors"))
    GTEST_SKIP() << "no fixture: run tests/reference/make_pref_reference.py (make test does)";
  const PreferenceFixture f;
  const std::vector<double> losses = fabrica_losses(f, GetParam());
  const Tensor expected = f.ref.tensor(GetParam() + ".losses");
  for (size_t s = 0; s < losses.size(); ++s) {
    const double want = expected.data<float>()[s];
    EXPECT_NEAR(losses[s], want, 1e-4 * std::fabs(want)) << GetParam() << " step " << s + 1;
  }
}

INSTANTIATE_TEST_SUITE_P(Stages, PreferenceReference,
                         ::testing::Values("dpo_sigmoid", "dpo_sigmoid_smoothing", "dpo_sigmoid_ftx", "dpo_hinge",
                                           "dpo_ipo", "dpo_orpo", "dpo_simpo", "kto", "rm"));

TEST(PreferenceReference, FirstSigmoidStepIsLn2) {
  if (!std::filesystem::exists(test::reference_dir() + "/pref/reference.safetensors"))
    GTEST_SKIP() << "no fixture: run tests/reference/make_pref_reference.py (make test does)";
  const PreferenceFixture f;
  EXPECT_NEAR(fabrica_losses(f, "dpo_sigmoid")[0], std::log(2.0), 1e-6);
}

}  // namespace
}  // namespace fab
