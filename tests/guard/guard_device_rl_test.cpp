// GuardDevice.* for generation and the RL stages: the rollout engine, `generate` and the cached
// decoder on the guard device (tests/guard/guard_device.h) -- the KV caches, positions and every
// activation on the device, the logits copied to the host for sampling -- and grpo and ppo with
// their rollouts, old and reference log-probabilities, rewards, critic and updates, against the
// same runs on the CPU.
//
// The CPU's rollouts of a model without adapters take the concurrent slot steps with the CPU's own
// decode kernels; a device always takes the op-by-op path, which the CPU takes too under LoRA. So
// with LoRA on both sides the runs agree bit for bit; without, the tokens do (greedy ones in bf16).
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include "dataset/prepare.h"
#include "dataset/template_test_support.h"
#include "guard/guard_device.h"
#include "infer/generate.h"
#include "infer/kv_cache.h"
#include "infer/rollout.h"
#include "io/safetensors.h"
#include "models/hf_model.h"
#include "models/model_config.h"
#include "tokenizer/tokenizer.h"
#include "train/finetuning.h"
#include "train/stages/rollout_stage.h"
#include "parallel/parallelize.h"
#include "train/stages/rollout_stage.h"
#include "train/trainer.h"
#include "test_util.h"

namespace fab {
namespace {
namespace fs = std::filesystem;

std::unique_ptr<DecoderModel> tiny_model(Device device, const LoraOptions& lora = {},
                                         Precision precision = Precision::fp32) {
  const ModelConfig c = parse_model_config(R"({"model_type":"qwen3","vocab_size":40,"hidden_size":32,
    "intermediate_size":48,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"head_dim":16,
    "max_position_embeddings":64})", "test");
  DecoderOptions options{precision, false, 64};
  options.lora = lora;
  options.device = device;
  auto m = std::make_unique<DecoderModel>(c, options);
  m->init_random(11);
  return m;
}

std::vector<RolloutRequest> requests() {
  return {{{1, 2, 3}, 7}, {{5, 6, 7, 8, 9, 10}, 8}, {{11}, 9}, {{12, 13, 14, 15}, 10}, {{16, 17}, 11}};
}

std::vector<std::vector<int32_t>> tokens_of(const std::vector<RolloutOutput>& outputs) {
  std::vector<std::vector<int32_t>> t;
  for (const RolloutOutput& o : outputs) t.push_back(o.tokens);
  return t;
}

TEST(GuardDevice, RolloutsAndGenerationEqualTheCpu) {
  for (const Precision precision : {Precision::fp32, Precision::bf16}) {
    auto cpu = tiny_model(Device::cpu(), {}, precision);
    auto guard = tiny_model(test::guard_device(), {}, precision);
    // The CPU's fast decode kernels round bf16 otherwise: there, greedy tokens only.
    for (const double temperature : precision == Precision::fp32 ? std::vector<double>{0.0, 1.0}
                                                                 : std::vector<double>{0.0}) {
      SamplingOptions o;
      o.max_new_tokens = 9;
      o.temperature = temperature;
      o.top_k = 20;
      o.stop_ids = {3};
      EXPECT_EQ(tokens_of(rollout(*guard, requests(), o, 2)), tokens_of(rollout(*cpu, requests(), o, 2)))
          << "temperature " << temperature;
      EXPECT_EQ(generate(*guard, {4, 5, 6}, o), generate(*cpu, {4, 5, 6}, o)) << "temperature " << temperature;
    }
    // The cached decoder, one sequence at a time: the op-by-op path on both sides, bit for bit.
    KvCache on_cpu = make_kv_cache(*cpu, 2, 16), on_guard = make_kv_cache(*guard, 2, 16);
    Tensor ids = Tensor::empty({2, 3}, DType::i64, MemoryCategory::activations);
    for (int64_t i = 0; i < 6; ++i) ids.data<int64_t>()[i] = i + 1;
    for (int step = 0; step < 3; ++step) {
      const Tensor a = logits_cached(*cpu, ids, on_cpu), b = logits_cached(*guard, ids, on_guard);
      ASSERT_TRUE(b.device().is_host());
      EXPECT_EQ(0, std::memcmp(a.raw(), b.raw(), a.bytes())) << "step " << step;
    }
  }
}

TEST(GuardDevice, LoraRolloutsEqualTheCpuBitForBit) {
  LoraOptions lora;
  lora.rank = 4;
  lora.targets = {"q_proj", "v_proj", "down_proj"};
  auto cpu = tiny_model(Device::cpu(), lora), guard = tiny_model(test::guard_device(), lora);
  // The host runs one engine per thread, the device one engine: the decode GEMM's fixed order makes them agree.
  ASSERT_TRUE(cpu->decode_concurrent());
  ASSERT_FALSE(guard->decode_concurrent());
  SamplingOptions o;
  o.max_new_tokens = 9;
  o.temperature = 1.0;
  EXPECT_EQ(tokens_of(rollout(*guard, requests(), o, 3)), tokens_of(rollout(*cpu, requests(), o, 3)));
  SlotKvCache a = make_slot_cache(*cpu, 2, 16), b = make_slot_cache(*guard, 2, 16);
  Tensor ids = Tensor::empty({5}, DType::i64, MemoryCategory::activations);
  for (int64_t i = 0; i < 5; ++i) ids.data<int64_t>()[i] = 2 * i + 1;
  const std::vector<SlotSpan> spans{{1, 3}, {0, 2}};
  const Tensor la = logits_slots(*cpu, ids, spans, a), lb = logits_slots(*guard, ids, spans, b);
  EXPECT_EQ(0, std::memcmp(la.raw(), lb.raw(), la.bytes()));
}

// stage grpo / ppo through the Trainer on both devices, from the data preparation `fabrica train`
// runs: the demo-like addition prompts with a real tokenizer, the exact-match reward, LoRA.
class GuardDeviceRl : public ::testing::TestWithParam<const char*> {};

std::vector<StepRecord> train_rl(const std::string& stage, const std::string& model, const std::string& out,
                                 Device device) {
  const TrainConfig c = parse_train_config(
      "model_name_or_path: " + model + "\nstage: " + stage + "\ndataset: " + model + "/prompts.jsonl\n"
      "template: qwen3_nothink\nreward: exact_match\nnum_generations: 4\nper_device_train_batch_size: 2\n"
      "ppo_mini_batch_size: 1\nppo_epochs: 2\ntemperature: 1.0\ntop_k: 50\nmax_new_tokens: 6\n"
      "learning_rate: 1.0e-2\nmax_steps: 3\nsave_steps: 2\nlogging_steps: 1\nseed: 3\nfinetuning_type: lora\n"
      "lora_rank: 4\nlora_target: all\nkl_loss_coef: 0.1\noutput_dir: " + out + "\n",
      "test.yaml");
  const Tokenizer tokenizer = Tokenizer::load(model);
  PreparedData data = prepare_data(c, tokenizer, out + "/cache");
  DecoderOptions o(Precision::fp32, false, 64);
  o.device = device;
  apply_finetuning(c, 2, o);
  auto m = load_model_folder(model, o, uint64_t(c.seed));
  TrainData td{data.train, data.eval, tokenizer.pad_id().value_or(0)};
  td.rollout = rollout_environment(c, tokenizer);
  Trainer trainer(c, parallelize(std::move(m), nullptr, c), std::move(td));
  EXPECT_TRUE(trainer.run());
  return trainer.history();
}

TEST_P(GuardDeviceRl, RunEqualsTheCpuBitForBit) {
  FAB_REQUIRE_SHARED_DATA();
  const std::string stage = GetParam();
  const std::string model = test::fresh_dir("rl-model");
  for (const char* file : {"tokenizer.json", "tokenizer_config.json"})
    fs::copy_file(test::shared_dir() + "/data/tokenizers/qwen3/" + file, model + "/" + file);
  std::ofstream(model + "/config.json") << R"({"model_type":"qwen3","vocab_size":151669,"hidden_size":32,
    "intermediate_size":48,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"head_dim":8,
    "max_position_embeddings":64,"tie_word_embeddings":true})";
  {
    std::ofstream prompts(model + "/prompts.jsonl");
    for (const auto& [a, b] : std::vector<std::pair<int, int>>{{3, 4}, {10, 22}, {7, 8}, {41, 1}})
      prompts << "{\"prompt\": \"What is " << a << "+" << b << "?\", \"answer\": \"" << a + b << "\"}\n";
  }
  const std::string on_cpu = test::fresh_dir(stage + "-cpu"), on_guard = test::fresh_dir(stage + "-guard");
  const auto cpu = train_rl(stage, model, on_cpu, Device::cpu());
  const auto guard = train_rl(stage, model, on_guard, test::guard_device());
  ASSERT_EQ(guard.size(), cpu.size());
  for (size_t i = 0; i < cpu.size(); ++i) {
    EXPECT_EQ(guard[i].loss, cpu[i].loss) << stage << " step " << i + 1;
    EXPECT_EQ(guard[i].grad_norm, cpu[i].grad_norm) << stage << " step " << i + 1;
  }
  test::expect_same_tensors(on_cpu + "/adapter_model.safetensors", on_guard + "/adapter_model.safetensors", stage);
}

INSTANTIATE_TEST_SUITE_P(Stages, GuardDeviceRl, ::testing::Values("grpo", "ppo"));

}  // namespace
}  // namespace fab
