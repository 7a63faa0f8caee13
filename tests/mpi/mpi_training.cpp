#include "mpi/mpi_training.h"

#include <gtest/gtest.h>

#include <fstream>

#include "models/hf_model.h"
#include "mpi/mpi_world.h"
#include "parallel/layout.h"
#include "parallel/parallelize.h"
#include "train/finetuning.h"
#include "train/synthetic_data.h"
#include "test_util.h"

namespace fab::test {

std::string model_folder(const std::string& name, const std::string& config_json) {
  const std::string dir = fresh_scratch_dir(name);
  if (world().rank() == 0) std::ofstream(dir + "/config.json") << config_json;
  world().barrier("model folder");
  return dir;
}

TrainConfig train_config(const std::string& model, const std::string& output, int64_t batch,
                         const std::string& file_keys, const std::string& extra) {
  return parse_train_config("model_name_or_path: " + model + "\nstage: sft\noutput_dir: " + output +
                                "\nmax_steps: 20\nper_device_train_batch_size: " + std::to_string(batch) +
                                "\nlearning_rate: 1.0e-2\nlr_scheduler_type: cosine\nwarmup_steps: 2\nlogging_steps: 1\n"
                                "weight_decay: 0.1\nsave_steps: 0\nseed: 5\nddp_bucket_size: 0.01\neval_strategy: steps\n"
                                "eval_steps: 10\nper_device_eval_batch_size: 4\n" +
                                file_keys,
                            "test.yaml", as_overrides(extra));
}

std::vector<StepRecord> train_model(const TrainConfig& c, std::unique_ptr<DecoderModel> model, DeviceMesh* mesh,
                                    int64_t samples) {
  TrainData data{synthetic_samples(samples, 1), synthetic_samples(6, 2), 0};
  Trainer trainer(c, parallelize(std::move(model), mesh, c), std::move(data));
  trainer.run();
  return trainer.history();
}

std::vector<StepRecord> train_at_layout(const TrainConfig& c, Communicator& group, int64_t samples) {
  const ModelConfig model_config = load_model_config(c.model_name_or_path + "/config.json");
  const ParallelLayout layout = parallel_layout(c, model_config, group.size());
  DeviceMesh mesh(group, layout.sizes());
  ModelShare share = model_share({Precision::fp32, false, 64}, layout, mesh, c);
  apply_finetuning(c, model_config.num_hidden_layers, share.options);
  return train_model(c, load_model_folder(c.model_name_or_path, share.options, uint64_t(c.seed)), &mesh, samples);
}

std::vector<double> single_process_losses(int64_t steps, const std::function<std::vector<StepRecord>()>& train_alone) {
  std::vector<double> losses(size_t(steps), 0.0);
  if (world().rank() == 0) {
    const auto history = train_alone();
    for (size_t i = 0; i < history.size() && i < losses.size(); ++i) losses[i] = history[i].loss;
  }
  world().all_reduce(losses.data(), int64_t(losses.size()), "reference losses").wait();
  return losses;
}

void expect_same_losses(const std::vector<StepRecord>& got, const std::vector<double>& reference, const std::string& what) {
  ASSERT_EQ(got.size(), reference.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i].loss, reference[i], 1e-5 * reference[i]) << what << " step " << i + 1;
}

}  // namespace fab::test
