#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "config/train_config.h"
#include "core/error.h"
#include "test_util.h"

namespace fab {
namespace {

std::string error_of(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  try {
    parse_train_config(yaml, "run.yaml", overrides);
  } catch (const UserError& e) {
    return e.what();
  }
  return "accepted";
}

TEST(TrainConfig, ReadsLlamaFactoryKeysWithTheirTypes) {
  TrainConfig c = parse_train_config(
      "model_name_or_path: models/tiny\nstage: pt\ndataset: c4_demo,wiki_demo\ncutoff_len: 512\n"
      "learning_rate: 1.0e-4\nnum_train_epochs: 3.0\nbf16: true\nreport_to: [tensorboard]\n"
      "resume_from_checkpoint: null\ntemplate: qwen3\n",
      "run.yaml");
  EXPECT_EQ(c.model_name_or_path, "models/tiny");
  EXPECT_EQ(c.stage, Stage::pt);
  EXPECT_EQ(c.dataset, "c4_demo,wiki_demo");
  EXPECT_EQ(c.cutoff_len, 512);
  EXPECT_DOUBLE_EQ(c.learning_rate, 1e-4);
  EXPECT_TRUE(c.bf16);
  EXPECT_EQ(c.report_to, "tensorboard");
  EXPECT_EQ(c.resume_from_checkpoint, "");
  EXPECT_EQ(c.chat_template, "qwen3");
  EXPECT_EQ(c.adam_beta2, 0.999);  // untouched keys keep transformers' defaults
}

TEST(TrainConfig, OverridesWinAndAreTyped) {
  TrainConfig c = parse_train_config("learning_rate: 1.0e-4\n", "run.yaml", {"learning_rate=3e-4", "max_steps=20"});
  EXPECT_DOUBLE_EQ(c.learning_rate, 3e-4);
  EXPECT_EQ(c.max_steps, 20);
  EXPECT_NE(error_of("", {"max_steps=lots"}).find("key \"max_steps\": expected an integer"), std::string::npos);
  EXPECT_NE(error_of("", {"max_steps"}).find("expected key=value"), std::string::npos);
}

// As in the YAML, a key set twice on the command line (or with its alias) is an error: it used
// to keep the last value, so `tensor_model_parallel_size=2 tensor_parallel_size=1` ran tp 1.
TEST(TrainConfig, AnOverrideSetTwiceIsAnError) {
  const std::string twice = error_of("", {"learning_rate=1", "max_steps=2", "learning_rate=2"});
  EXPECT_NE(twice.find("override \"learning_rate=2\": key \"learning_rate\" is set twice on the command line (also by "
                       "\"learning_rate=1\")"),
            std::string::npos)
      << twice;
  const std::string alias = error_of("", {"tensor_model_parallel_size=2", "tensor_parallel_size=1"});
  EXPECT_NE(alias.find("key \"tensor_parallel_size\" is set twice on the command line"), std::string::npos) << alias;
  // Overriding the YAML's key, by its name or its alias, is what overrides are for.
  EXPECT_EQ(parse_train_config("tensor_parallel_size: 2\n", "run.yaml", {"tensor_model_parallel_size=1"})
                .tensor_parallel_size,
            1);
}

// A folder or a file without settings is named as such, not as a missing model_name_or_path.
TEST(TrainConfig, AFolderOrAnEmptyFileIsNamed) {
  auto load_error = [](const std::string& path, const std::vector<std::string>& overrides = {}) {
    try {
      load_train_config(path, overrides);
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  const std::string dir = test::scratch_path("config-folder");
  std::filesystem::create_directories(dir);
  EXPECT_NE(load_error(dir).find(dir + ": is a folder; expected a YAML file"), std::string::npos);
  const std::string comments = test::scratch_path("comments.yaml");
  std::ofstream(comments) << "# model_name_or_path: later\n\n";
  EXPECT_NE(load_error(comments).find(comments + ": no settings (the file is empty or only comments)"),
            std::string::npos);
  EXPECT_EQ(load_error(comments, {"stage=pt"}), "accepted");  // the command line may give every key
}

TEST(TrainConfig, TraceStepsBeyondMaxStepsAreRefused) {
  EXPECT_NE(error_of("trace: true\nmax_steps: 5\ntrace_steps: [6, 8]\n")
                .find("trace_steps [6, 8] begins after max_steps 5: no step would be traced"),
            std::string::npos);
  EXPECT_EQ(error_of("trace: true\nmax_steps: 5\ntrace_steps: [5, 8]\n"), "accepted");  // traces step 5
}

TEST(TrainConfig, UnknownKeysGetADidYouMeanWithTheLine) {
  const std::string e = error_of("stage: pt\nlearning_rat: 1.0\n");
  EXPECT_NE(e.find("run.yaml:2: unknown key \"learning_rat\" (did you mean \"learning_rate\"?)"), std::string::npos) << e;
}

TEST(TrainConfig, WrongTypesNameTheKey) {
  EXPECT_NE(error_of("cutoff_len: long\n").find("run.yaml:1: key \"cutoff_len\": expected an integer"), std::string::npos);
  EXPECT_NE(error_of("bf16: maybe\n").find("expected true or false"), std::string::npos);
  EXPECT_NE(error_of("stage: {a: 1}\n").find("expected a string"), std::string::npos);
  EXPECT_NE(error_of("a: [\n").find("not valid YAML"), std::string::npos);
}

bool mentions(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// Values torch or transformers would refuse, and values that would divide by zero or overflow.
TEST(TrainConfig, NumbersOutOfRangeNameTheKey) {
  EXPECT_PRED2(mentions, error_of("per_device_eval_batch_size: 0\n"), "per_device_eval_batch_size must be positive, got 0");
  EXPECT_PRED2(mentions, error_of("per_device_eval_batch_size: -2\n"), "per_device_eval_batch_size must be positive");
  EXPECT_PRED2(mentions, error_of("adam_beta1: -5\n"), "adam_beta1 must be in [0, 1), got -5");
  EXPECT_PRED2(mentions, error_of("adam_beta2: 1\n"), "adam_beta2 must be in [0, 1), got 1");
  EXPECT_PRED2(mentions, error_of("threads: -3\n"), "threads must be >= 0");
  EXPECT_PRED2(mentions, error_of("val_size: -3\n"), "val_size must be >= 0");
  EXPECT_PRED2(mentions, error_of("save_steps: -1\n"), "save_steps must be >= 0");
  EXPECT_PRED2(mentions, error_of("warmup_steps: -5\n"), "warmup_steps must be >= 0");
  EXPECT_PRED2(mentions, error_of("learning_rate: .nan\n"), "key \"learning_rate\": expected a finite number");
  EXPECT_PRED2(mentions, error_of("num_train_epochs: .inf\n"), "key \"num_train_epochs\": expected a finite number");
  EXPECT_PRED2(mentions, error_of("max_steps: 1e300\n"), "key \"max_steps\": expected an integer");
  EXPECT_PRED2(mentions, error_of("seed: -9.3e18\n"), "key \"seed\": expected an integer");
  EXPECT_PRED2(mentions, error_of("lr_scheduler_type: sawtooth\n"), "run.yaml: lr_scheduler_type \"sawtooth\" is not supported");
  EXPECT_EQ(error_of("adam_beta1: 0\nadam_beta2: 0.95\nval_size: 0.1\nsave_steps: 0\n"), "accepted");
}

TEST(TrainConfig, DuplicateComplexAndEmptyKeysAreErrors) {
  EXPECT_PRED2(mentions, error_of("cutoff_len: 8\nstage: pt\ncutoff_len: 16\n"),
               "run.yaml:3: key \"cutoff_len\" is set twice (first on line 1)");
  EXPECT_PRED2(mentions, error_of("? [a, b]\n: 1\n"), "run.yaml:1: a key must be a plain name");
  EXPECT_PRED2(mentions, error_of("? {a: 1}\n: 1\n"), "a key must be a plain name");
  EXPECT_PRED2(mentions, error_of("", {"cutoff_len="}), "override \"cutoff_len=\": expected key=value with a value");
}

// One reading of booleans, in YAML and in key=value overrides alike.
TEST(TrainConfig, BooleansReadTheSameEverywhere) {
  for (const char* yes : {"true", "True", "TRUE", "yes", "Yes", "on", "1"}) {
    EXPECT_EQ(parse_bool(yes), true) << yes;
    EXPECT_TRUE(parse_train_config(std::string("bf16: ") + yes + "\n", "run.yaml").bf16) << yes;
    EXPECT_TRUE(parse_train_config("", "run.yaml", {std::string("bf16=") + yes}).bf16) << yes;
  }
  for (const char* no : {"false", "False", "FALSE", "no", "No", "off", "0"}) {
    EXPECT_EQ(parse_bool(no), false) << no;
    EXPECT_FALSE(parse_train_config(std::string("shuffle: ") + no + "\n", "run.yaml").shuffle) << no;
    EXPECT_FALSE(parse_train_config("", "run.yaml", {std::string("shuffle=") + no}).shuffle) << no;
  }
  EXPECT_EQ(parse_bool("2"), std::nullopt);
  EXPECT_EQ(parse_bool(""), std::nullopt);
}

TEST(TrainConfig, FeaturesNotYetImplementedSaySo) {
  EXPECT_NE(error_of("use_dora: true\n").find("\"use_dora\" is not implemented in Fabrica yet"), std::string::npos);
  // A feature key set to its default asks for nothing (LLaMA-Factory's examples write these).
  EXPECT_EQ(error_of("save_only_model: false\n"), "accepted");
  EXPECT_NE(error_of("stage: ppo\nreward: exact_match\nkl_ctrl_type: adaptive\n")
                .find("kl_ctrl_type adaptive is not implemented in Fabrica yet"),
            std::string::npos);
  EXPECT_NE(error_of("stage: ppo\nreward: exact_match\nasync_save: true\n")
                .find("async_save with stage ppo is not implemented in Fabrica yet"),
            std::string::npos);
  TrainConfig c = parse_train_config("preprocessing_num_workers: 16\nddp_timeout: 180000000\n", "run.yaml");
  EXPECT_EQ(c.accepted_keys, (std::vector<std::string>{"preprocessing_num_workers"}));
  EXPECT_EQ(c.ddp_timeout, 180000000);
}

// stage ppo: num_generations 1 and the critic's learning rate the actor's unless set; grpo keeps 8.
TEST(TrainConfig, PpoDefaultsAndRanges) {
  const TrainConfig ppo = parse_train_config("stage: ppo\nreward: exact_match\nlearning_rate: 3e-4\n", "run.yaml");
  EXPECT_EQ(ppo.num_generations, 1);
  EXPECT_DOUBLE_EQ(ppo.critic_learning_rate, 3e-4);
  EXPECT_EQ(parse_train_config("stage: grpo\nreward: exact_match\n", "run.yaml").num_generations, 8);
  EXPECT_DOUBLE_EQ(parse_train_config("stage: ppo\nreward: exact_match\ncritic_learning_rate: 1e-5\n", "run.yaml")
                       .critic_learning_rate,
                   1e-5);
  EXPECT_NE(error_of("stage: ppo\n").find("stage ppo needs reward"), std::string::npos);
  EXPECT_NE(error_of("stage: ppo\nreward: exact_match\nlam: 1.5\n").find("lam must be in [0, 1], got 1.5"),
            std::string::npos);
  EXPECT_NE(error_of("stage: ppo\nreward: exact_match\ncliprange_value: 0\n").find("cliprange_value must be positive"),
            std::string::npos);
  EXPECT_NE(error_of("stage: ppo\nreward: exact_match\nkl_penalty: full\n").find("kl_penalty \"full\" must be k1"),
            std::string::npos);
}

// Settings under which grpo learns nothing are refused; reward_timeout and truncation are checked.
TEST(TrainConfig, RlSettingsThatLearnNothingAreRefused) {
  const std::string grpo = "stage: grpo\nreward: exact_match\n";
  EXPECT_NE(error_of(grpo, {"temperature=0"}).find("stage grpo with temperature 0 and num_generations 8: greedy "
                                                   "decoding gives every response of a group the same text"),
            std::string::npos);
  EXPECT_NE(error_of(grpo, {"top_k=1"}).find("stage grpo with top_k 1 and num_generations 8"), std::string::npos);
  EXPECT_NE(error_of(grpo, {"num_generations=1"}).find("stage grpo with num_generations 1"), std::string::npos);
  EXPECT_EQ(error_of("stage: ppo\nreward: exact_match\ntemperature: 0\n"), "accepted");  // ppo's critic learns
  EXPECT_NE(error_of(grpo, {"reward_timeout=0"}).find("reward_timeout must be positive seconds, got 0"),
            std::string::npos);
  EXPECT_NE(error_of(grpo, {"truncation=right"}).find("truncation \"right\" must be error, left or middle (right would "
                                                      "cut off the end of the prompt"),
            std::string::npos);
  const TrainConfig c = parse_train_config(grpo, "run.yaml");
  EXPECT_EQ(c.truncation, "error");
  EXPECT_DOUBLE_EQ(c.reward_timeout, 600.0);
}

// Issue 31: TRL's loss_type means a loss_agg_mode, importance_sampling_level sequence means policy_loss
// gspo, epsilon / epsilon_high are clip_ratio_low / _high; settings that disagree are refused.
TEST(TrainConfig, TrlLossNamesMapOntoVerlKeys) {
  const std::string grpo = "stage: grpo\nreward: exact_match\n";
  for (const auto& [type, mode] : std::vector<std::pair<std::string, std::string>>{
           {"grpo", "seq-mean-token-mean"}, {"bnpo", "token-mean"}, {"dapo", "token-mean"},
           {"dr_grpo", "seq-mean-token-sum-norm"}})
    EXPECT_EQ(parse_train_config(grpo, "run.yaml", {"loss_type=" + type}).loss_agg_mode, mode) << type;
  EXPECT_EQ(parse_train_config(grpo, "run.yaml").loss_agg_mode, "token-mean");
  EXPECT_EQ(parse_train_config(grpo, "run.yaml", {"importance_sampling_level=sequence"}).policy_loss, "gspo");
  const TrainConfig eps = parse_train_config(grpo + "epsilon: 0.1\nepsilon_high: 0.28\n", "run.yaml");
  EXPECT_DOUBLE_EQ(eps.clip_ratio_low, 0.1);
  EXPECT_DOUBLE_EQ(eps.clip_ratio_high, 0.28);
  EXPECT_EQ(parse_train_config(grpo, "run.yaml", {"loss_type=dapo", "loss_agg_mode=token-mean"}).loss_agg_mode,
            "token-mean");
  EXPECT_NE(error_of(grpo, {"loss_type=dapo", "loss_agg_mode=seq-mean-token-mean"})
                .find("loss_type dapo means loss_agg_mode token-mean, but loss_agg_mode is seq-mean-token-mean"),
            std::string::npos);
  EXPECT_NE(error_of(grpo, {"importance_sampling_level=sequence", "policy_loss=cispo"})
                .find("importance_sampling_level sequence is policy_loss gspo, but policy_loss is cispo"),
            std::string::npos);
  EXPECT_NE(error_of(grpo, {"adv_estimator=gae"}).find("adv_estimator \"gae\" with stage grpo"), std::string::npos);
  EXPECT_NE(error_of("stage: ppo\nreward: exact_match\nadv_estimator: rloo\n").find("expected gae"),
            std::string::npos);
  EXPECT_NE(error_of(grpo, {"scale_rewards=group", "norm_adv_by_std=false"}).find("disagree"), std::string::npos);
  EXPECT_NE(error_of(grpo, {"policy_loss=cispo", "clip_ratio_low=1.5"}).find("(or 1 with policy_loss cispo), got 1.5"),
            std::string::npos);
  EXPECT_EQ(parse_train_config(grpo, "run.yaml", {"policy_loss=cispo", "clip_ratio_low=1"}).clip_ratio_low, 1.0);
  EXPECT_NE(error_of("stage: ppo\nreward: exact_match\nloss_type: dr_grpo\n").find("not implemented for stage ppo"),
            std::string::npos);
  EXPECT_NE(error_of(grpo, {"filter_groups=true", "max_num_gen_batches=0"}).find("max_num_gen_batches must be at least 1"),
            std::string::npos);
}

// Stages grpo and ppo sample as verl and TRL do unless told otherwise (temperature 1, top_p 1,
// top_k off), not with LLaMA-Factory's generation defaults; what the config sets is kept, each key
// on its own, from the YAML or the command line; other stages keep the documented defaults.
TEST(TrainConfig, RlStagesSampleWithVerlDefaultsUnlessSet) {
  for (const std::string stage : {"grpo", "ppo"}) {
    const std::string yaml = "stage: " + stage + "\nreward: exact_match\n";
    const TrainConfig c = parse_train_config(yaml, "run.yaml");
    EXPECT_EQ(c.temperature, 1.0) << stage;
    EXPECT_EQ(c.top_p, 1.0) << stage;
    EXPECT_EQ(c.top_k, 0) << stage;
    const TrainConfig set = parse_train_config(yaml + "temperature: 0.95\ntop_k: 50\n", "run.yaml", {"top_p=0.7"});
    EXPECT_EQ(set.temperature, 0.95) << stage;
    EXPECT_EQ(set.top_p, 0.7) << stage;
    EXPECT_EQ(set.top_k, 50) << stage;
    const TrainConfig one = parse_train_config(yaml, "run.yaml", {"temperature=0.6"});
    EXPECT_EQ(one.temperature, 0.6) << stage;
    EXPECT_EQ(one.top_p, 1.0) << stage;
    EXPECT_EQ(one.top_k, 0) << stage;
  }
  const TrainConfig sft = parse_train_config("stage: sft\n", "run.yaml");
  EXPECT_EQ(sft.temperature, 0.95);
  EXPECT_EQ(sft.top_p, 0.7);
  EXPECT_EQ(sft.top_k, 50);
}

// LLaMA-Factory's `deepspeed: examples/deepspeed/ds_z3_config.json` selects ZeRO-3; a stage that
// contradicts zero_stage, a missing file and bad JSON are errors naming the file.
TEST(TrainConfig, DeepSpeedConfigSelectsTheZeroStage) {
  const std::filesystem::path dir = std::filesystem::path(test::fresh_dir("deepspeed-config"));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "ds_z2_config.json") << R"({"train_batch_size": "auto", "zero_optimization": {"stage": 2}})";
  std::ofstream(dir / "broken.json") << "{";
  const std::string source = (dir / "run.yaml").string();
  EXPECT_EQ(parse_train_config("deepspeed: examples/deepspeed/ds_z2_config.json\n", source).zero_stage, 2);
  EXPECT_EQ(parse_train_config("deepspeed: ds_z2_config.json\nzero_stage: 2\n", source).zero_stage, 2);
  auto error = [&](const std::string& yaml) {
    try {
      parse_train_config(yaml, source);
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error("deepspeed: ds_z2_config.json\nzero_stage: 3\n").find("contradicts"), std::string::npos);
  EXPECT_NE(error("deepspeed: missing.json\n").find("cannot open missing.json"), std::string::npos);
  EXPECT_NE(error("deepspeed: broken.json\n").find("not valid JSON"), std::string::npos);
  EXPECT_NE(error("zero_stage: 4\n").find("zero_stage must be 0, 1, 2 or 3"), std::string::npos);
}

// LLaMA-Factory's own example configs parse: every key is known, and anything Fabrica cannot do
// yet is reported as such (never as an unknown key or a type error).
TEST(TrainConfig, LlamaFactoryExamplesParse) {
  const std::filesystem::path dir = std::filesystem::path(FAB_SOURCE_DIR) / "../shared/data/llamafactory/examples";
  if (!std::filesystem::exists(dir)) GTEST_SKIP() << "no " << dir;
  int seen = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".yaml") continue;
    ++seen;
    try {
      load_train_config(entry.path().string());
    } catch (const UserError& e) {
      std::istringstream lines(e.what());
      for (std::string line; std::getline(lines, line);)
        EXPECT_NE(line.find("not implemented in Fabrica yet"), std::string::npos) << entry.path() << ": " << line;
    }
  }
  EXPECT_GE(seen, 6);
}

TEST(TrainConfig, LlamaFactoryFullSftExampleRunsZero3) {
  const std::filesystem::path yaml =
      std::filesystem::path(FAB_SOURCE_DIR) / "../shared/data/llamafactory/examples/train_full_qwen3_full_sft.yaml";
  if (!std::filesystem::exists(yaml)) GTEST_SKIP() << "no " << yaml;
  EXPECT_EQ(load_train_config(yaml.string()).zero_stage, 3);
}

TEST(TrainConfig, ResolvedConfigRoundTrips) {
  TrainConfig c = parse_train_config("stage: pt\ncutoff_len: 77\nlearning_rate: 2.5e-4\n", "run.yaml");
  TrainConfig again = parse_train_config(train_config_to_yaml(c), "resolved.yaml");
  EXPECT_EQ(again.cutoff_len, 77);
  EXPECT_DOUBLE_EQ(again.learning_rate, 2.5e-4);
  EXPECT_EQ(train_config_to_yaml(again), train_config_to_yaml(c));
}

TEST(TrainConfig, DocsAreGeneratedFromTheSchema) {
  std::ifstream in(std::filesystem::path(FAB_SOURCE_DIR) / "docs/CONFIG.md");
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_EQ(text.str(), config_reference_markdown()) << "docs/CONFIG.md is stale: run build/fabrica config-reference > docs/CONFIG.md";
}

// LLaMA-Factory keys from its docs and examples: mapped to what they mean here, or accepted.
TEST(TrainConfig, LlamaFactoryOnlyKeysAreKnown) {
  const TrainConfig c = parse_train_config(
      "disable_shuffling: true\nrecompute_layers: true\ndisable_gradient_checkpointing: true\n"
      "include_num_input_tokens_seen: true\nuse_cpu: true\n",
      "run.yaml");
  EXPECT_FALSE(c.shuffle);
  EXPECT_FALSE(c.recompute_layers);
  EXPECT_EQ(c.accepted_keys, (std::vector<std::string>{"include_num_input_tokens_seen", "use_cpu"}));
}

// Every field of LLaMA-Factory's hparams dataclasses and of transformers' Seq2SeqTrainingArguments
// (tests/config/llamafactory_keys.txt, written by tests/config/llamafactory_keys.py) is a key here:
// supported, accepted, or "not implemented" — never "unknown key".
TEST(TrainConfig, EveryLlamaFactoryKeyIsKnown) {
  std::ifstream in(std::filesystem::path(FAB_SOURCE_DIR) / "tests/config/llamafactory_keys.txt");
  ASSERT_TRUE(in) << "tests/config/llamafactory_keys.txt";
  int seen = 0;
  for (std::string key; std::getline(in, key);) {
    if (key.empty() || key[0] == '#') continue;
    ++seen;
    EXPECT_EQ(error_of(key + ": null\n"), "accepted") << key;
  }
  EXPECT_GE(seen, 300);
}

TEST(TrainConfig, TrainingArgumentsMapToFabrica) {
  TrainConfig c = parse_train_config("gradient_checkpointing: true\nddp_bucket_cap_mb: 50\noptim: adamw_torch\n", "run.yaml");
  EXPECT_TRUE(c.recompute_layers);
  EXPECT_EQ(c.ddp_bucket_size, 50.0);
  c = parse_train_config("gradient_checkpointing: true\ndisable_gradient_checkpointing: true\n", "run.yaml");
  EXPECT_FALSE(c.recompute_layers);
  EXPECT_NE(error_of("optim: sgd\n").find("optim \"sgd\" is not implemented in Fabrica yet"), std::string::npos);
  EXPECT_NE(error_of("use_dora: true\n").find("\"use_dora\" is not implemented in Fabrica yet"), std::string::npos);
  EXPECT_EQ(error_of("temperature: 0.6\ninclude_num_input_tokens_seen: non_padding\nsave_strategy: steps\n"), "accepted");
  // Hub tokens are accepted but never written with the resolved config.
  c = parse_train_config("hf_hub_token: hf_secret\n", "run.yaml");
  EXPECT_EQ(train_config_to_yaml(c).find("hf_secret"), std::string::npos);
}

}  // namespace
}  // namespace fab
