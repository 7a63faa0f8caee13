// GuardDevice.*: the training path on the guard device (tests/guard/guard_device.h), whose memory
// faults on any host access outside its own kernels and copies. A run there must equal the CPU
// run bit for bit (the kernels are the CPU's), so every test compares with the same run on the CPU.
// `ctest -R Guard` runs them; the data-parallel ones are in tests/mpi/guard_device_mpi_test.cpp.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/backend.h"
#include "core/error.h"
#include "guard/guard_device.h"
#include "io/safetensors.h"
#include "kernels/kernel_table.h"
#include "models/decoder.h"
#include "models/hf_model.h"
#include "test_util.h"
#include "train/synthetic_data.h"
#include "train/finetuning.h"
#include "parallel/parallelize.h"
#include "train/trainer.h"

namespace fab {
namespace {
namespace fs = std::filesystem;

std::vector<float> host_floats(const Tensor& t) {
  const Tensor h = t.to(Device::cpu(), MemoryCategory::temporaries);
  return std::vector<float>(h.data<float>(), h.data<float>() + h.numel());
}

TEST(GuardDevice, HostAccessToDeviceMemoryFaults) {
  const Device guard = test::guard_device();
  Tensor t = Tensor::zeros({1024}, DType::f32, MemoryCategory::temporaries, guard);
  // The backend's own kernels and copies reach it ...
  Tensor ones = Tensor::empty({1024}, DType::f32, MemoryCategory::temporaries);
  for (int64_t i = 0; i < 1024; ++i) ones.data<float>()[i] = 1.0f;
  t.copy_from(ones);
  backend(guard.kind).kernels().scale(t.data<float>(), 1024, 3.0f);
  EXPECT_EQ(host_floats(t)[1023], 3.0f);
  // ... and refuse host memory, which a GPU's kernels could not read ...
  EXPECT_THROW(backend(guard.kind).kernels().scale(ones.data<float>(), 1024, 3.0f), Error);
  // ... the host does not reach it.
  EXPECT_DEATH({ volatile float x = t.data<float>()[5]; (void)x; }, "");
  EXPECT_DEATH(t.data<float>()[0] = 1.0f, "");
}

// ZeRO-2/3's releasable buffers: decommitted pages read zero once committed again, are not
// resident meanwhile, and fault even in the device's own kernels until committed, as a GPU's
// unmapped granules do; the partial pages at a range's ends are zeroed, not released.
TEST(GuardDevice, DecommittedMemoryFaultsUntilCommittedAndComesBackAsZeros) {
  const Device guard = test::guard_device();
  Backend& b = backend(guard.kind);
  const size_t page = size_t(::sysconf(_SC_PAGESIZE)), floats_per_page = page / sizeof(float);
  const int64_t n = int64_t(8 * floats_per_page);
  Tensor t = b.releasable_zeros(n, DType::f32, MemoryCategory::parameters);
  Tensor ones = Tensor::empty({n}, DType::f32, MemoryCategory::temporaries);
  for (int64_t i = 0; i < n; ++i) ones.data<float>()[i] = 1.0f;
  t.copy_from(ones);
  EXPECT_EQ(b.resident_bytes(t.raw(), t.bytes()), 8 * page);
  // From the middle of page 1 to the middle of page 6: pages 2..5 go, the two halves are zeroed.
  float* from = t.data<float>() + floats_per_page + floats_per_page / 2;
  const size_t bytes = 5 * page;
  b.decommit(from, bytes);
  EXPECT_EQ(b.resident_bytes(t.raw(), t.bytes()), 4 * page);
  EXPECT_EQ(b.kernels().sum_squares(t.data<float>(), int64_t(floats_per_page + floats_per_page / 2)),
            double(floats_per_page + floats_per_page / 2));  // what stays before the range
  // A copy of the backend's own (a kernel would fault the same way, but its OpenMP threads do
  // not survive the death test's fork).
  std::vector<float> host(bytes / sizeof(float));
  EXPECT_DEATH(b.copy(host.data(), Device::cpu(), from, guard, bytes), "");
  b.commit(from, bytes);
  EXPECT_EQ(b.resident_bytes(t.raw(), t.bytes()), 8 * page);
  const std::vector<float> back = host_floats(t);
  const int64_t first = int64_t(floats_per_page + floats_per_page / 2), last = first + int64_t(bytes / sizeof(float));
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(back[size_t(i)], i >= first && i < last ? 0.0f : 1.0f) << i;
}

ModelConfig tiny_config(bool qk_norm) {
  ModelConfig c;
  c.model_type = qk_norm ? "qwen3" : "llama";
  c.vocab_size = 64;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.max_position_embeddings = 64;
  c.qk_norm = qk_norm;
  c.attention_bias = !qk_norm;
  return c;
}

Tensor host_i64(const std::vector<int64_t>& v, Shape shape) {
  Tensor t = Tensor::empty(std::move(shape), DType::i64, MemoryCategory::activations);
  std::memcpy(t.raw(), v.data(), v.size() * sizeof(int64_t));
  return t;
}

// One forward/backward of two packed rows (document mask, restarting positions) on `device`:
// the loss and every gradient, read back to the host.
std::pair<double, std::vector<float>> one_step(const ModelConfig& c, Precision precision, Device device) {
  DecoderOptions o(precision, false, 32);
  o.device = device;
  DecoderModel model(c, o);
  model.init_random(11);
  std::vector<int64_t> ids(2 * 12), labels(2 * 12), positions(2 * 12);
  Tensor doc = Tensor::empty({2, 12}, DType::i32, MemoryCategory::activations);
  for (int64_t i = 0; i < 24; ++i) {
    ids[size_t(i)] = (i * 7 + 3) % 64;
    labels[size_t(i)] = i % 5 == 0 ? -100 : (i * 11 + 1) % 64;
    const int64_t t = i % 12, start = t < 5 ? 0 : 5;  // two samples per row: [0, 5) and [5, 12)
    positions[size_t(i)] = t - start;
    doc.data<int32_t>()[i] = int32_t(start);
  }
  const SequenceLayout layout{host_i64(positions, {2, 12}), doc};
  const double loss = model.forward_backward(host_i64(ids, {2, 12}), host_i64(labels, {2, 12}), 0.05f, layout);
  return {loss, host_floats(model.params().grads())};
}

void expect_same_step(bool qk_norm, Precision precision) {
  const ModelConfig c = tiny_config(qk_norm);
  const auto [cpu_loss, cpu_grads] = one_step(c, precision, Device::cpu());
  const auto [guard_loss, guard_grads] = one_step(c, precision, test::guard_device());
  EXPECT_EQ(guard_loss, cpu_loss);
  ASSERT_EQ(guard_grads.size(), cpu_grads.size());
  EXPECT_EQ(0, std::memcmp(guard_grads.data(), cpu_grads.data(), cpu_grads.size() * sizeof(float)))
      << "gradients differ from the CPU's";
}

TEST(GuardDevice, DecoderStepEqualsTheCpuBitForBit) {
  expect_same_step(false, Precision::fp32);
  expect_same_step(true, Precision::fp32);
}

TEST(GuardDevice, Bf16DecoderStepEqualsTheCpuBitForBit) { expect_same_step(true, Precision::bf16); }

using test::fresh_dir;

std::string tiny_model_folder() {
  const std::string dir = fresh_dir("model");
  std::ofstream(dir + "/config.json") << R"({"model_type":"qwen3","vocab_size":64,"hidden_size":32,
    "intermediate_size":48,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"head_dim":8,
    "max_position_embeddings":64,"tie_word_embeddings":true})";
  return dir;
}

TrainConfig config_for(const std::string& output, const std::string& extra = "") {
  return parse_train_config("model_name_or_path: " + tiny_model_folder() + "\nstage: sft\noutput_dir: " + output +
                                "\nmax_steps: 6\nper_device_train_batch_size: 2\ngradient_accumulation_steps: 2\n"
                                "learning_rate: 1.0e-2\nlr_scheduler_type: cosine\nwarmup_steps: 2\nlogging_steps: 1\n"
                                "weight_decay: 0.1\nsave_steps: 3\nseed: 5\nmax_grad_norm: 0.5\n",
                            "test.yaml", test::as_overrides(extra));
}

std::unique_ptr<Trainer> make_trainer(const TrainConfig& c, Device device) {
  DecoderOptions o(c.bf16 ? Precision::bf16 : Precision::fp32, c.recompute_layers, 64);
  o.device = device;
  o.value_head = c.stage == Stage::rm;
  apply_finetuning(c, 2, o);  // lora / freeze, as train_command does
  auto model = load_model_folder(c.model_name_or_path, o, uint64_t(c.seed));
  // Preference stages read sequences 2i and 2i + 1 as item i (kto: with a tag per item).
  TrainData data{test::synthetic_samples(20, 1), test::synthetic_samples(6, 2), 0};
  if (c.stage == Stage::kto) data.train_desirable = {1, 0, 1, 1, 0, 1, 0, 0, 1, 1}, data.eval_desirable = {1, 0, 1};
  return std::make_unique<Trainer>(c, parallelize(std::move(model), nullptr, c), std::move(data));
}

void expect_same_history(const Trainer& got, const Trainer& want) {
  ASSERT_EQ(got.history().size(), want.history().size());
  for (size_t i = 0; i < want.history().size(); ++i) {
    EXPECT_EQ(got.history()[i].loss, want.history()[i].loss) << "step " << want.history()[i].step;
    EXPECT_EQ(got.history()[i].grad_norm, want.history()[i].grad_norm) << "step " << want.history()[i].step;
  }
}

void expect_same_weights(const std::string& a, const std::string& b) {
  test::expect_same_tensors(a + "/model.safetensors", b + "/model.safetensors");
}

// The trainer, its optimizer, evaluation, checkpoints and the final save on the guard device.
void expect_trainer_matches_cpu(const std::string& name, const std::string& extra) {
  const std::string on_cpu = fresh_dir(name + "-cpu"), on_guard = fresh_dir(name + "-guard");
  auto cpu = make_trainer(config_for(on_cpu, extra), Device::cpu());
  ASSERT_TRUE(cpu->run());
  auto guard = make_trainer(config_for(on_guard, extra), test::guard_device());
  ASSERT_TRUE(guard->run());
  expect_same_history(*guard, *cpu);
  expect_same_weights(on_guard, on_cpu);
  std::ifstream metrics(on_guard + "/metrics.jsonl");
  std::string line;
  ASSERT_TRUE(std::getline(metrics, line));
  const int64_t peak = nlohmann::json::parse(line).value("device_peak_memory_bytes", int64_t(0));
  const int64_t parameters = load_model_config(config_for(on_guard).model_name_or_path + "/config.json").num_parameters();
  EXPECT_GE(peak, 16 * parameters) << "metrics.jsonl: the device's peak memory holds weights, gradients and moments";
  const std::string shard = "/checkpoint-3/optimizer-rank-0-of-1.safetensors";
  const SafetensorsFile saved_guard = SafetensorsFile::open(on_guard + shard);
  const SafetensorsFile saved_cpu = SafetensorsFile::open(on_cpu + shard);
  for (const char* moment : {"exp_avg", "exp_avg_sq"})
    EXPECT_EQ(0, std::memcmp(saved_guard.tensor(moment).raw(), saved_cpu.tensor(moment).raw(),
                             saved_cpu.tensor(moment).bytes()))
        << "the saved " << moment;
}

TEST(GuardDevice, TrainerRunEqualsTheCpuBitForBit) {
  expect_trainer_matches_cpu("fp32", "eval_steps: 3\neval_strategy: steps\n");
}

TEST(GuardDevice, Bf16RecomputedPackedRunEqualsTheCpuBitForBit) {
  expect_trainer_matches_cpu("bf16", "bf16: true\nrecompute_layers: true\nneat_packing: true\n");
}

// With dropout: its masks are drawn by the device's own kernel (dropout_mask), the same as the CPU's.
TEST(GuardDevice, LoraRunEqualsTheCpuBitForBit) {
  const std::string extra = "finetuning_type: lora\nlora_rank: 4\nlora_target: all\nlora_dropout: 0.1\n";
  const std::string on_cpu = fresh_dir("lora-cpu"), on_guard = fresh_dir("lora-guard");
  auto cpu = make_trainer(config_for(on_cpu, extra), Device::cpu());
  ASSERT_TRUE(cpu->run());
  auto guard = make_trainer(config_for(on_guard, extra), test::guard_device());
  ASSERT_TRUE(guard->run());
  expect_same_history(*guard, *cpu);
  EXPECT_GT(test::expect_same_tensors(on_cpu + "/adapter_model.safetensors", on_guard + "/adapter_model.safetensors"),
            0u);
}

TEST(GuardDevice, FreezeRunEqualsTheCpuBitForBit) {
  expect_trainer_matches_cpu("freeze", "finetuning_type: freeze\nfreeze_trainable_layers: 1\nbf16: true\n");
}

TEST(GuardDevice, PreferenceRunsEqualTheCpuBitForBit) {
  expect_trainer_matches_cpu("dpo", "stage: dpo\npref_beta: 0.2\n");
  expect_trainer_matches_cpu("kto", "stage: kto\nbf16: true\n");
}

// The reward model's value head: its scores and gradients go through host copies of a few rows.
TEST(GuardDevice, RewardModelRunEqualsTheCpuBitForBit) {
  expect_trainer_matches_cpu("rm", "stage: rm\n");
  test::expect_same_tensors(test::scratch_path("rm-cpu") + "/value_head.safetensors",
                            test::scratch_path("rm-guard") + "/value_head.safetensors");
}

TEST(GuardDevice, AsyncSaveAndResumeContinueTheRunBitForBit) {
  const std::string full = fresh_dir("full"), resumed = fresh_dir("resumed");
  auto uninterrupted = make_trainer(config_for(full, "async_save: true\n"), test::guard_device());
  ASSERT_TRUE(uninterrupted->run());
  fs::copy(full + "/checkpoint-3", resumed + "/checkpoint-3", fs::copy_options::recursive);
  auto again = make_trainer(config_for(resumed, "resume_from_checkpoint: true\n"), test::guard_device());
  ASSERT_TRUE(again->run());
  ASSERT_EQ(again->history().size(), 3u);
  for (const StepRecord& r : again->history()) EXPECT_EQ(r.loss, uninterrupted->history()[size_t(r.step - 1)].loss);
  expect_same_weights(resumed, full);
}

TEST(GuardDevice, WhatIsNotImplementedOnADeviceIsRefusedByName) {
  const std::string out = fresh_dir("refused");
  auto refused = [&](const std::string& extra, DecoderOptions o, const std::string& says) {
    o.device = test::guard_device();
    try {
      const TrainConfig c = config_for(out, extra);
      auto model = load_model_folder(c.model_name_or_path, o, 1);
      Trainer t(c, parallelize(std::move(model), nullptr, c), TrainData{test::synthetic_samples(4, 1), {}, 0});
      ADD_FAILURE() << "not refused: " << says;
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  DecoderOptions stage;
  stage.stage = PipelineStage{{{0, 1}}, true, false};  // the first of two pipeline stages
  refused("", stage, "pipeline_parallel_size > 1");
}

TEST(GuardDevice, CudaWithoutAGpuIsAUserErrorNamingWhatIsMissing) {
  EXPECT_EQ(resolve_device("cpu"), Device::cpu());
  EXPECT_THROW(resolve_device("tpu"), UserError);
  if (cuda_backend().available()) GTEST_SKIP() << "this machine has a GPU: " << cuda_backend().name() << " [needs: no gpu]";
  EXPECT_EQ(resolve_device("auto"), Device::cpu());
  try {
    resolve_device("cuda");
    ADD_FAILURE() << "device: cuda accepted without a GPU";
  } catch (const UserError& e) {
    const std::string what = e.what();
    EXPECT_TRUE(what.find("GPU") != std::string::npos || what.find("CUDA") != std::string::npos) << what;
  }
}

}  // namespace
}  // namespace fab
