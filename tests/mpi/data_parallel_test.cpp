// Data parallel and ZeRO-1/2/3 against one process: the same global batch gives the same per-step
// losses (1e-5 relative over 20 fp32 steps, evaluating on the way with fewer eval batches than
// ranks), ZeRO-3 ranks each hold about 1/N of the model states, and a checkpoint saved by N ranks
// resumes on fewer with the uninterrupted run's losses; a mixture-of-experts model with its aux loss too.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "models/hf_model.h"
#include "mpi/mpi_training.h"
#include "mpi/mpi_world.h"
#include "train/synthetic_data.h"
#include "train/trainer.h"
#include "test_util.h"

namespace fab {
namespace {
namespace fs = std::filesystem;

// A folder every rank sees (one machine), named by the world size so runs at 2 and 4 ranks can
// go on side by side.
std::string shared_dir(const std::string& name) { return test::fresh_scratch_dir(name); }

std::string model_folder(const std::string& config_json) { return test::model_folder("model", config_json); }

const char* kTinyLlama = R"({"model_type":"llama","vocab_size":64,"hidden_size":32,"intermediate_size":48,
  "num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"max_position_embeddings":64,
  "tie_word_embeddings":true})";

TrainConfig config_for(const std::string& model, const std::string& output, int64_t batch, const std::string& extra) {
  return test::train_config(model, output, batch, "gradient_accumulation_steps: 2\n", extra);
}

std::vector<StepRecord> train(const TrainConfig& c, Communicator* group) {
  auto model = load_model_folder(c.model_name_or_path, {Precision::fp32, false, 64}, uint64_t(c.seed));
  DeviceMesh mesh(*group, ParallelSizes{.dp = group->size()});
  return test::train_model(c, std::move(model), &mesh, 48);
}

// Rank 0 trains alone with the whole global batch; the losses go to every rank.
std::vector<double> single_process_losses(const TrainConfig& c) {
  return test::single_process_losses(c.max_steps, [&] {
    LocalCommunicator alone;
    return train(c, &alone);
  });
}

TEST(DataParallel, EveryZeroStageReproducesTheSingleProcessLosses) {
  Communicator& w = test::world();
  const std::string model = model_folder(kTinyLlama);
  const std::vector<double> reference =
      single_process_losses(config_for(model, shared_dir("reference"), 2 * w.size(), ""));
  for (int stage = 0; stage <= 3; ++stage) {
    const auto c = config_for(model, shared_dir("stage" + std::to_string(stage)), 2,
                              "zero_stage: " + std::to_string(stage) + "\n");
    const auto history = train(c, &w);
    ASSERT_EQ(history.size(), reference.size());
    for (size_t i = 0; i < history.size(); ++i)
      EXPECT_NEAR(history[i].loss, reference[i], 1e-5 * reference[i]) << "zero_stage " << stage << " step " << i + 1;
  }
}

// Per-rank model states after a step, against the formula: 4 bytes per element for parameters,
// 4 for gradients, 8 for the AdamW moments, divided by N where the stage shards them.
// A qwen3_moe (a dense layer after the MoE one) with its load-balancing loss on: micro-batches of
// one sample each, so one process and N ranks compute each aux over the same rows (it is per
// micro-batch, as in transformers) and the objectives agree.
TEST(DataParallel, MixtureOfExpertsWithAuxLossReproducesTheSingleProcessLosses) {
  Communicator& w = test::world();
  const std::string model = test::model_folder("moe_model", R"({"model_type":"qwen3_moe","vocab_size":64,
    "hidden_size":32,"intermediate_size":48,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,
    "head_dim":8,"max_position_embeddings":64,"tie_word_embeddings":true,"num_experts":4,"num_experts_per_tok":2,
    "moe_intermediate_size":16,"norm_topk_prob":true,"mlp_only_layers":[1]})");
  auto config = [&](const std::string& out, int64_t accumulation, const std::string& extra) {
    return test::train_config(model, shared_dir(out), 1,
                              "gradient_accumulation_steps: " + std::to_string(accumulation) + "\n",
                              "moe_aux_loss_coef: 0.05\nmax_steps: 8\n" + extra);
  };
  const std::vector<double> reference = single_process_losses(config("moe_reference", 2 * w.size(), ""));
  for (int stage : {1, 3}) {
    const auto history = train(config("moe_stage" + std::to_string(stage), 2,
                                      "zero_stage: " + std::to_string(stage) + "\n"),
                               &w);
    ASSERT_EQ(history.size(), reference.size());
    for (size_t i = 0; i < history.size(); ++i)
      EXPECT_NEAR(history[i].loss, reference[i], 1e-5 * std::fabs(reference[i])) << "zero " << stage << " step " << i;
  }
}

TEST(DataParallel, ZeroShardsTheModelStates) {
  Communicator& w = test::world();
  const std::string model_dir = model_folder(R"({"model_type":"llama","vocab_size":2048,"hidden_size":128,
    "intermediate_size":256,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,
    "max_position_embeddings":64})");
  for (int stage = 1; stage <= 3; ++stage) {
    auto model = load_model_folder(model_dir, {Precision::fp32, false, 64}, 3);
    const double n = double(model->params().numel()), ranks = w.size();
    DataParallel dp(*model, w, {stage, 1 << 20, {}, {}, {}});
    Tensor ids = Tensor::empty({2, 16}, DType::i64, MemoryCategory::activations);
    for (int64_t i = 0; i < ids.numel(); ++i) ids.data<int64_t>()[i] = (i * 7 + w.rank()) % 2048;
    dp.begin_step(1);
    dp.begin_micro_batch(0);
    model->forward_backward(ids, ids, 1.0f / 32);
    dp.finish_gradients();
    dp.clip_grad_norm(1.0);
    dp.optimizer_step(1e-3f);
    const ModelStateBytes s = dp.state_bytes();
    const double params = 4 * n / (stage == 3 ? ranks : 1), grads = 4 * n / (stage >= 2 ? ranks : 1);
    EXPECT_NEAR(double(s.parameters) / params, 1.0, 0.1) << "zero_stage " << stage;
    EXPECT_NEAR(double(s.gradients) / grads, 1.0, 0.1) << "zero_stage " << stage;
    EXPECT_NEAR(double(s.optimizer_state) / (8 * n / ranks), 1.0, 0.1) << "zero_stage " << stage;
  }
}

// One data-parallel step sends what a ring all-reduce of the gradients sends, 2 (N - 1) / N of
// their bytes, within 5% (the loss and target-count all-reduces are a few bytes more).
TEST(DataParallel, BytesSentPerStepAreTheRingFigure) {
  Communicator& w = test::world();
  auto model = load_model_folder(model_folder(kTinyLlama), {Precision::fp32, false, 64}, 3);
  DataParallel dp(*model, w, {0, 1 << 12, {}, {}, {}});
  EXPECT_GT(dp.bucket_count(), 2u);
  Tensor ids = Tensor::empty({2, 16}, DType::i64, MemoryCategory::activations);
  for (int64_t i = 0; i < ids.numel(); ++i) ids.data<int64_t>()[i] = (i * 5 + w.rank()) % 64;
  const int64_t before = w.stats().bytes_sent;
  dp.begin_step(1);
  dp.begin_micro_batch(0);
  model->forward_backward(ids, ids, 1.0f / 32);
  dp.finish_gradients();
  dp.optimizer_step(1e-3f);
  const double ring = 2.0 * (w.size() - 1) / w.size() * 4.0 * double(model->params().numel());
  EXPECT_NEAR(double(w.stats().bytes_sent - before) / ring, 1.0, 0.05);
}

// A ZeRO-3 checkpoint of N ranks resumes bit for bit on N ranks, and on one process (and on 2 when
// N = 4, under ZeRO-1) with the same global batch: the steps after it repeat the uninterrupted
// run's losses.
TEST(DataParallel, CheckpointsReshardToAnotherWorldSize) {
  Communicator& w = test::world();
  const std::string model = model_folder(kTinyLlama);
  const std::string saved = shared_dir("saved");
  const auto full = train(config_for(model, saved, 2, "zero_stage: 3\nsave_steps: 10\n"), &w);
  ASSERT_EQ(full.size(), 20u);
  auto check_resumed = [&](Communicator& group, const std::string& name, const std::string& extra,
                           bool bitwise = false) {
    const auto c = config_for(model, test::scratch_root() + "/" + name,
                              2 * w.size() / group.size(),
                              extra + "resume_from_checkpoint: " + saved + "/checkpoint-10\noverwrite_output_dir: true\n");
    const auto resumed = train(c, &group);
    ASSERT_EQ(resumed.size(), 10u) << name;
    for (const StepRecord& r : resumed) {
      if (bitwise)
        EXPECT_EQ(r.loss, full[size_t(r.step - 1)].loss) << name << " step " << r.step;
      else
        EXPECT_NEAR(r.loss, full[size_t(r.step - 1)].loss, 1e-5 * r.loss) << name << " step " << r.step;
    }
  };
  check_resumed(w, "resumed-on-" + std::to_string(w.size()), "zero_stage: 3\n", true);  // exact at the same size
  if (w.rank() == 0) {
    LocalCommunicator alone;
    check_resumed(alone, "resumed-on-1", "");
  }
  w.barrier("resumed on one process");
  if (w.size() == 4) {
    auto half = w.split(w.rank() / 2, w.rank());
    if (w.rank() < 2) check_resumed(*half, "resumed-on-2", "zero_stage: 1\n");
  }
  w.barrier("resumed");
}

}  // namespace
}  // namespace fab
