// LoRA and freeze fine-tuning: 5 LoRA SFT steps against PyTorch (tests/reference/
// make_lora_reference.py: PEFT's formulas, plain and rsLoRA), PEFT's adapter key set, exact
// resume of a LoRA run with dropout, merged weights equal to the adapters, the adapters-off
// switch, and freeze changing only the chosen parameters.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/safetensors.h"
#include "models/hf_model.h"
#include "models/peft_adapter.h"
#include "optim/adamw.h"
#include "optim/lr_schedule.h"
#include "train/finetuning.h"
#include "train/synthetic_data.h"
#include "parallel/parallelize.h"
#include "train/trainer.h"
#include "test_util.h"

namespace fab {
namespace {
namespace fs = std::filesystem;

using test::fresh_dir;

// A tiny llama folder with seeded weights (so runs that start from it can be compared with it).
std::string tiny_model_folder() {
  const std::string dir = fresh_dir("model");
  std::ofstream(dir + "/config.json") << R"({"model_type":"llama","vocab_size":64,"hidden_size":32,
    "intermediate_size":48,"num_hidden_layers":3,"num_attention_heads":4,"num_key_value_heads":2,
    "max_position_embeddings":64})";
  auto model = load_model_folder(dir, {Precision::fp32, false, 64}, 11);
  save_model_folder(*model, dir);
  return dir;
}

TrainConfig config_for(const std::string& model, const std::string& output, const std::string& extra) {
  return parse_train_config("model_name_or_path: " + model + "\nstage: sft\noutput_dir: " + output +
                                "\nmax_steps: 6\nper_device_train_batch_size: 2\ngradient_accumulation_steps: 2\n"
                                "learning_rate: 1.0e-2\nlr_scheduler_type: cosine\nwarmup_steps: 1\nlogging_steps: 1\n"
                                "weight_decay: 0.1\nsave_steps: 3\nseed: 5\n",
                            "test.yaml", test::as_overrides(extra));
}

std::unique_ptr<DecoderModel> model_for(const TrainConfig& c) {
  DecoderOptions options(c.bf16 ? Precision::bf16 : Precision::fp32, false, 64);
  apply_finetuning(c, load_model_config(c.model_name_or_path + "/config.json").num_hidden_layers, options);
  auto model = load_model_folder(c.model_name_or_path, options, uint64_t(c.seed));
  load_initial_adapter(c, *model);
  return model;
}

std::unique_ptr<Trainer> make_trainer(const TrainConfig& c) {
  TrainData data{test::synthetic_samples(20, 1), test::synthetic_samples(5, 2), 0};
  return std::make_unique<Trainer>(c, parallelize(model_for(c), nullptr, c), std::move(data));
}

class LoraReference : public ::testing::TestWithParam<std::string> {};

// The PyTorch run loads the same base and adapter; 5 AdamW steps with accumulation and clipping.
TEST_P(LoraReference, FiveSftStepsMatchPyTorch) {
  const std::string dir = test::reference_dir() + "/" + GetParam();
  if (!fs::exists(dir + "/reference.safetensors")) GTEST_SKIP() << "no " << dir << " (make test writes it)";
  const std::string base = test::reference_dir() + "/qwen3";
  const TrainConfig c = parse_train_config("model_name_or_path: " + base + "\nfinetuning_type: lora\n"
                                           "adapter_name_or_path: " + dir + "\noutput_dir: unused\n", "test.yaml");
  auto model = model_for(c);
  const SafetensorsFile ref = SafetensorsFile::open(dir + "/reference.safetensors");
  const SafetensorsFile data = SafetensorsFile::open(base + "/reference.safetensors");
  AdamW opt(model->params(), {0.9f, 0.95f, 1e-8f, 0.1f});
  LrSchedule schedule;
  schedule.type = "cosine";
  schedule.base_lr = std::stod(ref.metadata().at("lr"));
  schedule.warmup_steps = 1;
  schedule.total_steps = std::stoll(ref.metadata().at("steps"));
  const Tensor ids = data.tensor("train.input_ids"), labels = data.tensor("train.labels");
  const int64_t micro = ids.dim(1), b = ids.dim(2), t = ids.dim(3);
  for (int64_t step = 0; step < schedule.total_steps; ++step) {
    int64_t targets = 0;
    for (int64_t m = 0; m < micro; ++m)
      targets += DecoderModel::count_targets(labels.view((step * micro + m) * b * t, {b, t}));
    model->params().grads().zero_();
    double loss = 0;
    for (int64_t m = 0; m < micro; ++m)
      loss += model->forward_backward(ids.view((step * micro + m) * b * t, {b, t}),
                                      labels.view((step * micro + m) * b * t, {b, t}), 1.0f / float(targets));
    const double norm = clip_grad_norm(model->params(), 1.0);
    opt.step(float(schedule.lr(step)));
    loss /= double(targets);
    const double ref_loss = ref.tensor("losses").data<float>()[step], ref_norm = ref.tensor("grad_norms").data<float>()[step];
    EXPECT_NEAR(loss, ref_loss, 1e-5 * ref_loss) << "loss of step " << step;
    EXPECT_NEAR(norm, ref_norm, 1e-4 * ref_norm) << "grad norm of step " << step;
  }
  for (const ParamInfo& p : model->params().params())
    test::expect_close(model->params().values().view(p.offset, p.shape), ref.tensor("final.base_model.model." + p.name),
                       1e-4, p.name);
}

INSTANTIATE_TEST_SUITE_P(Cases, LoraReference, ::testing::Values("lora_all", "lora_rslora_qv"));

// The key set PEFT writes for these targets and modules_to_save (PEFT names, sorted).
std::set<std::string> peft_keys(int64_t layers, const std::vector<std::string>& targets,
                                const std::vector<std::string>& modules_to_save) {
  std::set<std::string> keys;
  for (int64_t i = 0; i < layers; ++i)
    for (const std::string& t : targets) {
      const bool mlp = t == "gate_proj" || t == "up_proj" || t == "down_proj";
      const std::string m = "base_model.model.model.layers." + std::to_string(i) + (mlp ? ".mlp." : ".self_attn.") + t;
      keys.insert(m + ".lora_A.weight");
      keys.insert(m + ".lora_B.weight");
    }
  for (const std::string& m : modules_to_save)
    keys.insert(m == "lm_head" ? "base_model.model.lm_head.weight" : "base_model.model.model." + m + ".weight");
  return keys;
}

TEST(Lora, OutputAndCheckpointsHoldAPeftAdapter) {
  const std::string model = tiny_model_folder(), out = fresh_dir("peft-keys");
  auto t = make_trainer(config_for(model, out, "finetuning_type: lora\nlora_rank: 4\nadditional_target: lm_head\n"));
  ASSERT_TRUE(t->run());
  // lora_target all on a dense decoder: its seven projections (shared_expert_gate is qwen2_moe's).
  const std::set<std::string> expected =
      peft_keys(3, {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}, {"lm_head"});
  for (const std::string& dir : {out, out + "/checkpoint-3"}) {
    ASSERT_TRUE(fs::exists(dir + "/adapter_model.safetensors")) << dir;
    EXPECT_FALSE(fs::exists(dir + "/model.safetensors")) << dir << ": the base is not saved again";
    const auto names = SafetensorsFile::open(dir + "/adapter_model.safetensors").names();
    EXPECT_EQ(std::set<std::string>(names.begin(), names.end()), expected) << dir;
    const auto j = nlohmann::json::parse(std::ifstream(dir + "/adapter_config.json"));
    EXPECT_EQ(j["peft_type"], "LORA");
    EXPECT_EQ(j["task_type"], "CAUSAL_LM");
    EXPECT_EQ(j["r"], 4);
    EXPECT_EQ(j["lora_alpha"], 8);  // LLaMA-Factory's default: 2 * rank
    EXPECT_EQ(j["use_rslora"], false);
    EXPECT_EQ(j["modules_to_save"], nlohmann::json({"lm_head"}));
    EXPECT_EQ(j["base_model_name_or_path"], model);
    EXPECT_EQ(j["target_modules"].size(), 7u);
  }
}

// Trainable state is the adapters alone: the optimizer and the gradients cover only them, and the
// frozen matrices are kept once, in bf16 with bf16: true.
TEST(Lora, TrainableStateIsTheAdaptersAlone) {
  const std::string model = tiny_model_folder();
  const TrainConfig c = config_for(model, "unused", "finetuning_type: lora\nlora_rank: 4\nlora_target: q_proj,v_proj\nbf16: true\n");
  auto m = model_for(c);
  int64_t adapter_elements = 0;
  for (const ParamInfo& p : m->params().params()) {
    EXPECT_TRUE(m->is_adapter(p.name)) << p.name;
    adapter_elements += p.numel();
  }
  EXPECT_EQ(adapter_elements, 3 * (4 * 32 + 32 * 4 + 4 * 32 + 16 * 4));  // per layer q: A (4, 32), B (32, 4); v: A, B (16, 4)
  EXPECT_FALSE(m->frozen_bf16().has_fp32());
  EXPECT_TRUE(m->frozen_bf16().contains("model.layers.0.mlp.down_proj.weight"));
  EXPECT_TRUE(m->frozen().contains("model.embed_tokens.weight"));
  AdamW opt(m->params(), {});
  EXPECT_EQ(opt.exp_avg().numel(), adapter_elements);
}

TEST(Lora, ResumeWithDropoutReproducesTheUninterruptedRunBitForBit) {
  const std::string model = tiny_model_folder(), a = fresh_dir("full"), b = fresh_dir("resumed");
  const std::string lora = "finetuning_type: lora\nlora_rank: 4\nlora_dropout: 0.2\n";
  auto full = make_trainer(config_for(model, a, lora));
  ASSERT_TRUE(full->run());
  fs::copy(a + "/checkpoint-3", b + "/checkpoint-3", fs::copy_options::recursive);
  auto resumed = make_trainer(config_for(model, b, lora + "resume_from_checkpoint: true\n"));
  ASSERT_TRUE(resumed->run());
  ASSERT_EQ(resumed->history().size(), 3u);
  for (const StepRecord& r : resumed->history()) {
    EXPECT_EQ(r.loss, full->history()[size_t(r.step - 1)].loss) << "step " << r.step;
    EXPECT_EQ(r.grad_norm, full->history()[size_t(r.step - 1)].grad_norm) << "step " << r.step;
  }
  const auto wa = SafetensorsFile::open(a + "/adapter_model.safetensors");
  const auto wb = SafetensorsFile::open(b + "/adapter_model.safetensors");
  for (const std::string& name : wa.names())
    EXPECT_EQ(0, std::memcmp(wa.tensor(name).raw(), wb.tensor(name).raw(), wa.tensor(name).bytes())) << name;
  // Dropout acts: the same run without it takes other steps.
  auto plain = make_trainer(config_for(model, fresh_dir("no-dropout"), "finetuning_type: lora\nlora_rank: 4\n"));
  ASSERT_TRUE(plain->run());
  EXPECT_NE(plain->history().back().loss, full->history().back().loss);
}

// Merging (W + scaling B A) gives the logits of the model with its adapters; switching the
// adapters off gives the base model's.
TEST(Lora, MergedWeightsAndAdaptersOffMatch) {
  const std::string model = tiny_model_folder(), out = fresh_dir("merge");
  auto t = make_trainer(config_for(model, out, "finetuning_type: lora\nlora_rank: 4\nuse_rslora: true\nsave_steps: 0\n"));
  ASSERT_TRUE(t->run());
  const TrainConfig c = config_for(model, "unused", "finetuning_type: lora\nadapter_name_or_path: " + out + "\n");
  auto adapted = model_for(c);
  Tensor ids = Tensor::empty({2, 9}, DType::i64, MemoryCategory::activations);
  for (int64_t i = 0; i < ids.numel(); ++i) ids.data<int64_t>()[i] = (i * 7 + 3) % 64;
  const Tensor with_adapters = adapted->logits(ids);
  adapted->set_adapters_enabled(false);
  const Tensor off = adapted->logits(ids);
  const Tensor base = load_model_folder(model, {Precision::fp32, false, 64})->logits(ids);
  EXPECT_EQ(0, std::memcmp(off.raw(), base.raw(), off.bytes()));
  EXPECT_GT(test::scaled_error(with_adapters.data<float>(), base.data<float>(), base.numel()), 1e-3);
  adapted->set_adapters_enabled(true);
  merge_adapters(*adapted);
  test::expect_close(adapted->logits(ids), with_adapters, 1e-5, "merged logits");
}

// With A = B = I and scaling 1 the adapter adds dropout(x) itself: on x = 1 each element is 0
// (probability p) or 1 / (1 - p), the same for the same seed and other for another.
Tensor dropout_of_ones(float p, uint64_t seed) {
  const int64_t rows = 256, n = 16;
  auto identity = [n] {
    Var v = make_var(Tensor::zeros({n, n}, DType::f32, MemoryCategory::activations));
    for (int64_t i = 0; i < n; ++i) v->value.data<float>()[i * n + i] = 1.0f;
    return v;
  };
  Var x = make_var(Tensor::empty({rows, n}, DType::f32, MemoryCategory::activations));
  for (int64_t i = 0; i < x->value.numel(); ++i) x->value.data<float>()[i] = 1.0f;
  Var y = make_var(Tensor::zeros({rows, n}, DType::f32, MemoryCategory::activations));
  Tape tape;
  add_lora(tape, x, y, {LoraBranch{identity(), identity(), 0, 3}}, LoraPass{1.0f, p, seed});
  return y->value;
}

TEST(Lora, DropoutMasksHaveTheirRateAndFollowTheSeed) {
  const Tensor a = dropout_of_ones(0.25f, 7), b = dropout_of_ones(0.25f, 7), c = dropout_of_ones(0.25f, 8);
  int64_t dropped = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const float v = a.data<float>()[i];
    EXPECT_TRUE(v == 0.0f || std::fabs(v - 1.0f / 0.75f) < 1e-6f) << v;
    dropped += v == 0.0f;
  }
  const double n = double(a.numel()), rate = double(dropped) / n;
  EXPECT_NEAR(rate, 0.25, 4 * std::sqrt(0.25 * 0.75 / n));
  EXPECT_EQ(0, std::memcmp(a.raw(), b.raw(), a.bytes()));
  EXPECT_NE(0, std::memcmp(a.raw(), c.raw(), a.bytes()));
}

TEST(Lora, BadSettingsAreUserErrors) {
  const std::string model = tiny_model_folder();
  EXPECT_THROW(model_for(config_for(model, "unused", "finetuning_type: lora\nlora_target: q_proj,lm_head\n")), UserError);
  EXPECT_THROW(model_for(config_for(model, "unused", "finetuning_type: lora\nadditional_target: mlp\n")), UserError);
  EXPECT_THROW(config_for(model, "unused", "finetuning_type: lora\nlora_dropout: 1.0\n"), UserError);
  EXPECT_THROW(model_for(config_for(model, "unused", "finetuning_type: lora\nadapter_name_or_path: " + model + "\n")),
               UserError);
}

// Freeze: the last layer's MLP and the final norm train; every other parameter keeps its bits.
TEST(Freeze, OnlyTheChosenParametersChange) {
  const std::string model = tiny_model_folder(), out = fresh_dir("freeze");
  auto t = make_trainer(config_for(model, out,
                                   "finetuning_type: freeze\nfreeze_trainable_layers: 1\nfreeze_trainable_modules: mlp\n"
                                   "freeze_extra_modules: lm_head\nsave_steps: 0\n"));
  ASSERT_TRUE(t->run());
  const HfWeights before = HfWeights::open(model), after = HfWeights::open(out);
  int changed = 0;
  for (const std::string& name : before.names()) {
    const Tensor x = before.file_of(name).tensor(name), y = after.file_of(name).tensor(name);
    const bool same = std::memcmp(x.raw(), y.raw(), x.bytes()) == 0;
    const bool trains = name.find(".2.mlp") != std::string::npos || name == "lm_head.weight";
    EXPECT_EQ(same, !trains) << name;
    changed += !same;
  }
  EXPECT_EQ(changed, 4);  // gate, up, down of layer 2 and lm_head
}

TEST(Freeze, NegativeLayersCountFromTheFirst) {
  const std::string model = tiny_model_folder();
  auto m = model_for(config_for(model, "unused", "finetuning_type: freeze\nfreeze_trainable_layers: -2\n"));
  std::set<std::string> trainable;
  for (const ParamInfo& p : m->params().params()) trainable.insert(p.name.substr(0, 15));
  EXPECT_EQ(trainable, (std::set<std::string>{"model.layers.0.", "model.layers.1."}));
}

}  // namespace
}  // namespace fab
