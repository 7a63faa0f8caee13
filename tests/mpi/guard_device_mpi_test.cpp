// GuardDevice.* over several processes: data parallel (ZeRO-0 to 3) on the guard device
// (tests/guard/guard_device.h), whose gradient buckets and parameter gathers go through device
// collectives (DeviceMesh::set_device_collectives; here host-staged copies, NCCL on CUDA) while
// host values (the loss sums, the gradient norm's squares) take the host group. Every step's loss
// and gradient norm, and the saved weights, equal the same data-parallel run on the CPU bit for bit.
// ZeRO-2/3 decommit the gradient and parameter ranges a rank does not hold; the guard keeps those
// pages closed even to its own kernels until they are committed again, as a GPU's unmapped
// granules are, so a missing commit fails here.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "guard/guard_device.h"
#include "io/safetensors.h"
#include "models/hf_model.h"
#include "mpi/mpi_world.h"
#include "parallel/tensor_parallel.h"
#include "train/synthetic_data.h"
#include "parallel/parallelize.h"
#include "train/trainer.h"
#include "test_util.h"

namespace fab {
namespace {

// A seeded model with its weights (loading them slices each tensor under tensor parallel).
// `kv_heads` 1 at tensor parallel 2: the key/value rows are replicated, their gradients summed.
std::string model_folder(int kv_heads = 2) {
  const std::string dir = test::fresh_scratch_dir("guard-model-" + std::to_string(kv_heads));
  if (test::world().rank() == 0) {
    std::ofstream(dir + "/config.json") << R"({"model_type":"llama","vocab_size":64,"hidden_size":32,
      "intermediate_size":48,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":)"
                                        << kv_heads << R"(,"max_position_embeddings":64,"tie_word_embeddings":true})";
    save_model_folder(*load_model_folder(dir, DecoderOptions(Precision::fp32, false, 64), 17), dir);
  }
  test::world().barrier("model folder");
  return dir;
}

std::vector<StepRecord> train(const std::string& model, const std::string& output, int zero_stage, Device device,
                              const std::string& extra = "") {
  const TrainConfig c = parse_train_config(
      "model_name_or_path: " + model + "\nstage: sft\noutput_dir: " + output +
          "\nmax_steps: 8\nper_device_train_batch_size: 2\ngradient_accumulation_steps: 2\nlearning_rate: 1.0e-2\n"
          "warmup_steps: 2\nlogging_steps: 1\nweight_decay: 0.1\nsave_steps: 4\nseed: 5\nddp_bucket_size: 0.01\n"
          "max_grad_norm: 0.5\nzero_stage: " + std::to_string(zero_stage) + "\n",
      "test.yaml", test::as_overrides(extra));
  DecoderOptions o(c.bf16 ? Precision::bf16 : Precision::fp32, false, 64);
  o.device = device;
  auto m = load_model_folder(c.model_name_or_path, o, uint64_t(c.seed));
  DeviceMesh mesh(test::world(), ParallelSizes{.dp = test::world().size()});
  if (!device.is_host()) mesh.set_device_collectives(test::guard_collectives);
  Trainer trainer(c, parallelize(std::move(m), &mesh, c), TrainData{test::synthetic_samples(48, 1), {}, 0});
  EXPECT_TRUE(trainer.run());
  return trainer.history();
}

// What rank 0 held of parameters and gradients on the device, in the last line of metrics.jsonl.
std::pair<int64_t, int64_t> held_bytes(const std::string& output) {
  std::ifstream in(output + "/metrics.jsonl");
  nlohmann::json last;
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.contains("memory_parameters_bytes")) last = j;
  }
  if (last.is_null()) return {-1, -1};
  return {last["memory_parameters_bytes"][0].get<int64_t>(), last["memory_gradients_bytes"][0].get<int64_t>()};
}

TEST(GuardDevice, DataParallelEqualsTheCpuRunBitForBit) {
  const std::string model = model_folder();
  std::map<std::string, std::pair<int64_t, int64_t>> held;
  for (const auto& [stage, extra] : std::vector<std::pair<int, std::string>>{
           {0, ""}, {1, ""}, {2, ""}, {3, ""}, {3, "bf16: true\n"}, {3, "async_save: true\n"}}) {
    const std::string tag = "zero" + std::to_string(stage) + (extra.empty() ? "" : "-" + extra.substr(0, extra.find(':')));
    const std::string on_cpu = test::fresh_scratch_dir("guard-cpu-" + tag);
    const std::string on_guard = test::fresh_scratch_dir("guard-dev-" + tag);
    const auto cpu = train(model, on_cpu, stage, Device::cpu(), extra);
    const auto guard = train(model, on_guard, stage, test::guard_device(), extra);
    ASSERT_EQ(guard.size(), cpu.size());
    for (size_t i = 0; i < cpu.size(); ++i) {
      EXPECT_EQ(guard[i].loss, cpu[i].loss) << tag << " step " << i + 1;
      EXPECT_EQ(guard[i].grad_norm, cpu[i].grad_norm) << tag << " step " << i + 1;
    }
    if (test::world().rank() != 0) continue;
    held[tag] = held_bytes(on_guard);
    test::expect_same_tensors(on_cpu + "/model.safetensors", on_guard + "/model.safetensors", tag);
  }
  if (test::world().rank() != 0) return;
  // The device's memory was handed back: ZeRO-2/3 hold fewer gradient pages, ZeRO-3 fewer
  // parameter pages, than ZeRO-0 (the guard counts what is not decommitted).
  EXPECT_LT(held["zero2"].second, held["zero0"].second);
  EXPECT_LT(held["zero3"].second, held["zero0"].second);
  EXPECT_LT(held["zero3"].first, held["zero0"].first);
  EXPECT_GT(held["zero3"].first, 0);
}

// Tensor parallel at 2 (and sequence parallel with ZeRO-3) on the guard device: activations and
// gradients through the tp group's device collectives, the vocabulary-parallel cross-entropy's
// passes as kernels, its row maxima and sums through the host group; the same bits as on the CPU.
std::vector<StepRecord> train_tp(const std::string& model, const std::string& output, bool sp, Device device) {
  const TrainConfig c = parse_train_config(
      "model_name_or_path: " + model + "\nstage: sft\noutput_dir: " + output +
          "\nmax_steps: 6\nper_device_train_batch_size: 2\ngradient_accumulation_steps: 2\nlearning_rate: 1.0e-2\n"
          "warmup_steps: 2\nlogging_steps: 1\nsave_steps: 3\nseed: 5\nddp_bucket_size: 0.01\nmax_grad_norm: 0.5\n"
          "tensor_parallel_size: 2\nzero_stage: " + std::string(sp ? "3" : "1") + "\n",
      "test.yaml");
  ParallelSizes sizes;
  sizes.tp = 2;
  sizes.dp = test::world().size() / 2;
  DeviceMesh mesh(test::world(), sizes);
  if (!device.is_host()) mesh.set_device_collectives(test::guard_collectives);
  TensorParallel tp(mesh.group("tp"), sp, mesh.device_group("tp"));
  DecoderOptions o(Precision::fp32, false, 64, &tp);
  o.device = device;
  auto m = load_model_folder(c.model_name_or_path, o, uint64_t(c.seed));
  Trainer trainer(c, parallelize(std::move(m), &mesh, c), TrainData{test::synthetic_samples(24, 1), {}, 0});
  EXPECT_TRUE(trainer.run());
  return trainer.history();
}

TEST(GuardDevice, TensorParallelEqualsTheCpuRunBitForBit) {
  if (test::world().size() % 2) GTEST_SKIP() << "tensor parallel at 2 needs an even world";
  for (const auto& [sp, kv_heads] : std::vector<std::pair<bool, int>>{{false, 2}, {true, 2}, {false, 1}}) {
    const std::string model = model_folder(kv_heads);
    const std::string tag = std::string(sp ? "sp" : "tp") + "-kv" + std::to_string(kv_heads);
    const auto cpu = train_tp(model, test::fresh_scratch_dir("guard-cpu-" + tag), sp, Device::cpu());
    const auto guard = train_tp(model, test::fresh_scratch_dir("guard-dev-" + tag), sp, test::guard_device());
    ASSERT_EQ(guard.size(), cpu.size());
    for (size_t i = 0; i < cpu.size(); ++i) {
      EXPECT_EQ(guard[i].loss, cpu[i].loss) << tag << " step " << i + 1;
      EXPECT_EQ(guard[i].grad_norm, cpu[i].grad_norm) << tag << " step " << i + 1;
    }
  }
}

// ZeRO-3's resume writes the whole weights into a buffer whose other ranks' parts were
// decommitted (DataParallel::commit_all_parameters first), then drops them again.
TEST(GuardDevice, Zero3ResumeOnTheDeviceIsExact) {
  const std::string model = model_folder();
  const std::string full = test::fresh_scratch_dir("guard-zero3-full");
  const std::string resumed = test::fresh_scratch_dir("guard-zero3-resumed");
  const auto run = train(model, full, 3, test::guard_device());
  const auto again = train(model, resumed, 3, test::guard_device(), "resume_from_checkpoint: " + full + "/checkpoint-4\n");
  ASSERT_EQ(again.size(), 4u);  // steps 5..8
  for (const StepRecord& r : again) {
    EXPECT_EQ(r.loss, run[size_t(r.step - 1)].loss) << "step " << r.step;
    EXPECT_EQ(r.grad_norm, run[size_t(r.step - 1)].grad_norm) << "step " << r.step;
  }
}

}  // namespace
}  // namespace fab
