// fabrica train / fabrica data prepare.
#include <omp.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "cli/args.h"
#include "cli/commands.h"
#include "core/error.h"
#include "data/prepare.h"
#include "models/hf_model.h"
#include "train/trainer.h"

namespace fab {
namespace fs = std::filesystem;

namespace {

TrainConfig config_from_args(int argc, char** argv, int first, const char* usage) {
  Args args(argc, argv, first, {}, {});
  FAB_USER_CHECK(!args.positional().empty(), "usage: {}", usage);
  std::vector<std::string> overrides(args.positional().begin() + 1, args.positional().end());
  TrainConfig c = load_train_config(args.positional()[0], overrides);
  if (!c.accepted_keys.empty()) {
    std::string keys;
    for (const std::string& k : c.accepted_keys) keys += (keys.empty() ? "" : ", ") + k;
    std::printf("note: accepted without effect in Fabrica: %s\n", keys.c_str());
  }
  if (c.threads > 0) omp_set_num_threads(int(c.threads));
  return c;
}

PreparedData prepare_and_report(const TrainConfig& c, const Tokenizer& tokenizer) {
  const auto start = std::chrono::steady_clock::now();
  PreparedData data = prepare_data(c, tokenizer);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("data: %lld train samples, %lld eval samples, %lld tokens; %lld truncated, %lld skipped%s "
              "(%.3f s, %d threads)\n",
              (long long)data.train.size(), (long long)data.eval.size(), (long long)data.stats.tokens,
              (long long)data.stats.truncated, (long long)data.stats.skipped,
              data.from_cache ? ", from cache" : "", seconds, omp_get_max_threads());
  return data;
}

}  // namespace

int run_data_prepare(int argc, char** argv) {
  const TrainConfig c = config_from_args(argc, argv, 3, "fabrica data prepare CONFIG.yaml [key=value ...]");
  FAB_USER_CHECK(!c.model_name_or_path.empty(), "model_name_or_path is required (its tokenizer is used)");
  prepare_and_report(c, Tokenizer::load(c.model_name_or_path));
  return 0;
}

// Checks that output_dir can be created (and written) before any work starts, leaving nothing
// behind: the folders this check creates are removed again.
void check_writable(const std::string& path) {
  fs::path first_new = fs::absolute(path);
  while (first_new.has_parent_path() && first_new != first_new.parent_path() && !fs::exists(first_new.parent_path()))
    first_new = first_new.parent_path();
  const bool existed = fs::exists(path);
  std::error_code error;
  fs::create_directories(path, error);
  const fs::path probe = fs::path(path) / ".fabrica-write-test";
  const bool writable = !error && std::ofstream(probe).good();
  fs::remove(probe, error);
  if (!existed) fs::remove_all(first_new, error);
  FAB_USER_CHECK(writable, "output_dir {} cannot be created or written", path);
}

int run_train(int argc, char** argv) {
  const TrainConfig c = config_from_args(argc, argv, 2, "fabrica train CONFIG.yaml [key=value ...]");
  FAB_USER_CHECK(!c.model_name_or_path.empty(), "model_name_or_path is required");
  FAB_USER_CHECK(fs::exists(fs::path(c.model_name_or_path) / "config.json"),
                 "model_name_or_path {}: no config.json there (expected a Hugging Face model folder)",
                 c.model_name_or_path);
  FAB_USER_CHECK(!c.output_dir.empty(), "output_dir is required");
  check_writable(c.output_dir);
  const bool resuming = !c.resume_from_checkpoint.empty() && c.resume_from_checkpoint != "false";
  FAB_USER_CHECK(resuming || c.overwrite_output_dir || !fs::exists(fs::path(c.output_dir) / "metrics.jsonl"),
                 "output_dir {} already holds a run: set overwrite_output_dir: true or resume_from_checkpoint: true",
                 c.output_dir);
  const Tokenizer tokenizer = Tokenizer::load(c.model_name_or_path);
  PreparedData data = prepare_and_report(c, tokenizer);
  if (!c.do_train) return 0;
  DecoderOptions options;
  options.precision = c.bf16 ? Precision::bf16 : Precision::fp32;
  options.recompute_layers = c.recompute_layers;
  options.max_seq_len = c.cutoff_len;
  auto model = load_model_folder(c.model_name_or_path, options, uint64_t(c.seed));
  FAB_USER_CHECK(tokenizer.vocab_size() <= model->config().vocab_size,
                 "the tokenizer has {} tokens but the model's vocab_size is {}", tokenizer.vocab_size(),
                 model->config().vocab_size);
  std::printf("model: %s, %lld parameters, %s, %d threads\n", model->config().model_type.c_str(),
              (long long)model->config().num_parameters(), c.bf16 ? "bf16" : "fp32", omp_get_max_threads());
  const int32_t pad = tokenizer.pad_id().value_or(tokenizer.eos_id().value_or(0));
  Trainer trainer(c, std::move(model), TrainData{data.train, data.eval, pad});
  std::printf("training: %lld steps\n", (long long)trainer.total_steps());
  const bool finished = trainer.run();
  if (finished) std::printf("done: model saved to %s\n", c.output_dir.c_str());
  return 0;
}

}  // namespace fab
