// fabrica train / fabrica data prepare.
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <thread>
#include <tuple>

#include <yaml-cpp/yaml.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/model_folders.h"
#include "comm/device_collectives.h"
#include "comm/world.h"
#include "config/yaml_file.h"
#include "core/backend.h"
#include "core/error.h"
#include "dataset/prepare.h"
#include "launch/launcher.h"
#include "launch/restart.h"
#include "launch/output_dir_lock.h"
#include "models/hf_model.h"
#include "parallel/layout.h"
#include "parallel/mesh.h"
#include "parallel/parallelize.h"
#include "plan/auto_layout.h"
#include "train/checkpoint.h"
#include "train/finetuning.h"
#include "train/stages/rollout_stage.h"
#include "train/trainer.h"

namespace fab {
namespace fs = std::filesystem;

namespace {

TrainConfig config_from_args(int argc, char** argv, int first, const char* usage) {
  Args args(argc, argv, first, {"max-restarts"}, {});
  FAB_USER_CHECK(!args.positional().empty(), "usage: {}", usage);
  std::vector<std::string> overrides(args.positional().begin() + 1, args.positional().end());
  if (args.has("max-restarts"))  // torchrun's spelling
    overrides.push_back("max_restarts=" + std::to_string(args.get_integer("max-restarts", 0, 0, 1 << 20)));
  TrainConfig c = load_train_config(args.positional()[0], overrides);
  FAB_USER_CHECK(!c.model_name_or_path.empty(), "{}: model_name_or_path is required (the Hugging Face model folder "
                 "to start from)", args.positional()[0]);
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
  const bool pairs = is_preference(c.stage);  // 2 sequences per item
  const std::string train =
      data.train.packed() ? format("{} train sequences packed from {} samples", data.train.size(), data.train.samples())
      : pairs             ? format("{} train {} ({} sequences)", data.train.size() / 2,
                                   c.stage == Stage::kto ? "examples" : "pairs", data.train.size())
                          : format("{} train samples", data.train.size());
  int64_t images = 0;
  for (const auto* per_sequence : {&data.train_images, &data.eval_images})
    for (const auto& sequence_images : *per_sequence) images += int64_t(sequence_images.size());
  const std::string image_note = images > 0 ? format(", {} images", images) : "";
  std::printf("data: %s, %lld eval %s, %lld tokens%s; %lld truncated, %lld skipped%s (%.3f s, %d threads)\n",
              train.c_str(), (long long)(pairs ? data.eval.size() / 2 : data.eval.size()),
              data.eval.packed() ? "sequences" : pairs ? "items" : "samples",
              (long long)data.stats.tokens, image_note.c_str(), (long long)data.stats.truncated,
              (long long)data.stats.skipped, data.from_cache ? ", from cache" : "", seconds, omp_get_max_threads());
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

namespace {

// A checkpoint resumes the stage that saved it: an sft checkpoint resumed as dpo would go on with
// sft's optimizer state and schedule under another loss, logged into the same metrics.jsonl.
void check_resumed_stage(const TrainConfig& c, const std::string& checkpoint) {
  std::string saved;
  try {
    const YAML::Node y =
        load_yaml_file((fs::path(checkpoint) / "train_config.yaml").string(), "the train_config.yaml its run saved");
    if (y["stage"] && y["stage"].IsScalar()) saved = y["stage"].Scalar();
  } catch (const UserError&) {
    return;  // no train_config.yaml, or one the resume itself reports as unreadable
  }
  FAB_USER_CHECK(saved.empty() || saved == stage_name(c.stage),
                 "resume_from_checkpoint: {} was saved by a stage {} run, and this run is stage {}: resuming would "
                 "go on with the {} run's optimizer state and schedule and mix the two losses in {}/metrics.jsonl. "
                 "To train {} from those weights, export them (fabrica export --checkpoint {} --output MODEL_DIR) and "
                 "start a new run with model_name_or_path: MODEL_DIR and another output_dir",
                 checkpoint, saved, c.stage, saved, c.output_dir, c.stage, checkpoint);
}

// The checks that must pass before anything is written.
void check_run_config(const TrainConfig& c) {
  FAB_USER_CHECK(!c.model_name_or_path.empty(), "model_name_or_path is required");
  FAB_USER_CHECK(fs::exists(fs::path(c.model_name_or_path) / "config.json"),
                 "model_name_or_path {}: no config.json there (expected a Hugging Face model folder)",
                 c.model_name_or_path);
  HfWeights::present(c.model_name_or_path);  // weights it cannot read fail here, before any work
  FAB_USER_CHECK(!c.output_dir.empty(), "output_dir is required");
  FAB_USER_CHECK(!fs::exists(c.output_dir) || !fs::equivalent(c.output_dir, c.model_name_or_path),
                 "output_dir {} is the model folder model_name_or_path {}: the trained model would replace the "
                 "weights it starts from; choose another output_dir",
                 c.output_dir, c.model_name_or_path);
  if (is_rollout(c.stage))  // max_new_tokens past the context fails before any work
    check_rollout_context(c, load_model_config((fs::path(c.model_name_or_path) / "config.json").string())
                                 .max_position_embeddings, nullptr);
  check_writable(c.output_dir);
  resolve_device(c.device);  // device: cuda without a GPU fails here, naming what is missing
  const std::string checkpoint = checkpoint_to_resume(c.resume_from_checkpoint, c.output_dir);
  const bool resuming = !checkpoint.empty();
  if (resuming) check_resumed_stage(c, checkpoint);
  FAB_USER_CHECK(resuming || c.overwrite_output_dir || !fs::exists(fs::path(c.output_dir) / "metrics.jsonl"),
                 "output_dir {} already holds a run: set overwrite_output_dir: true or resume_from_checkpoint: true",
                 c.output_dir);
}

ParallelLayout layout_of_run(const TrainConfig& c, int world_size) {
  return parallel_layout(c, load_model_config((fs::path(c.model_name_or_path) / "config.json").string()), world_size);
}

// Run by hand with nproc_per_node > 1, a cluster or max_restarts: this process becomes the
// launcher, and restarts the workers when they fail (max_restarts).
int launch(const TrainConfig& c, const ClusterFile& cluster, int workers, int argc, char** argv) {
  layout_of_run(c, workers);  // fails before any worker starts
  std::vector<std::string> worker = {fs::read_symlink("/proc/self/exe").string()};
  for (int i = 1; i < argc; ++i) worker.push_back(argv[i]);
  std::printf("launching %d workers: %s ...\n", workers, mpirun_command(c, cluster, worker)[0].c_str());
  std::fflush(stdout);
  return run_with_restarts(c, cluster, [&](const std::vector<std::string>& extra, const ClusterFile& hosts) {
    std::vector<std::string> args = worker;
    args.insert(args.end(), extra.begin(), extra.end());
    return mpirun_command(c, hosts, args);
  });
}

// Each node's first worker tokenizes; the others then read its cache.
PreparedData prepare_on_node(const TrainConfig& c, const Tokenizer& tokenizer, const WorldInfo& world,
                             Communicator& comm) {
  PreparedData data;
  if (world.local_rank == 0) data = prepare_and_report(c, tokenizer);
  comm.barrier("data prepared");
  if (world.local_rank != 0) data = prepare_data(c, tokenizer);
  return data;
}

// The longest sequence of the run: positions (the RoPE table) are made for it rather than for
// cutoff_len, which may be far longer than any sample (1e9 asked for a table of 1e9 positions).
int64_t longest_sequence(const PreparedData& data) {
  int64_t longest = 2;
  for (const TokenSequences* set : {&data.train, &data.eval})
    for (int64_t i = 0; i < set->size(); ++i) longest = std::max(longest, set->length(i));
  return longest;
}

// parallel: auto's measured step time: the median over the logged windows, the first (which
// warms caches and builds kernels) left out when there are others.
double measured_step_seconds(const std::vector<StepRecord>& history) {
  std::vector<double> seconds;
  for (size_t i = history.size() > 1 ? 1 : 0; i < history.size(); ++i) seconds.push_back(history[i].step_seconds);
  if (seconds.empty()) return 0;
  std::nth_element(seconds.begin(), seconds.begin() + seconds.size() / 2, seconds.end());
  return seconds[seconds.size() / 2];
}

// PreparedData's images (per sequence, one pixel buffer per image) as the model takes them (per
// sequence, one (patches, values) tensor and an (images, 3) grid). A sequence of one image keeps
// its buffer, one of several has them joined once; `prepared` is emptied as it goes.
std::vector<SequenceImages> model_images(std::vector<std::vector<ProcessedImage>>& prepared) {
  std::vector<SequenceImages> out(prepared.size());
  for (size_t s = 0; s < prepared.size(); ++s) {
    std::vector<ProcessedImage>& images = prepared[s];
    if (images.empty()) continue;
    auto pixels = std::make_shared<std::vector<float>>(std::move(images[0].pixel_values));
    auto grid = std::make_shared<std::vector<int64_t>>();
    int64_t patches = 0;
    for (size_t i = 0; i < images.size(); ++i) {
      if (i > 0) pixels->insert(pixels->end(), images[i].pixel_values.begin(), images[i].pixel_values.end());
      grid->insert(grid->end(), images[i].grid_thw.begin(), images[i].grid_thw.end());
      patches += images[i].patches();
    }
    std::vector<ProcessedImage>().swap(images);
    out[s].pixel_values = Tensor::from_external(pixels->data(), {patches, int64_t(pixels->size()) / patches},
                                                DType::f32, [pixels] {});
    out[s].grid_thw = Tensor::from_external(grid->data(), {int64_t(grid->size()) / 3, 3}, DType::i64, [grid] {});
  }
  prepared.clear();
  return out;
}

// Images need a model that takes them, and a vision-language model's image tokens need their
// images: checked before the first step rather than at the batch that holds them.
void check_images_fit_model(const TrainConfig& c, const PreparedData& data, const ModelConfig& model) {
  FAB_USER_CHECK(!has_images(data) || model.vision,
                 "dataset {}: it has images, and model_name_or_path {} (model_type {}) has no vision tower: train "
                 "image data with a vision-language model (qwen2_vl, qwen2_5_vl)",
                 c.dataset, c.model_name_or_path, model.model_type);
  if (!model.vision) return;
  if (has_images(data)) image_processor_of(c.model_name_or_path, *model.vision);
  for (const auto& [name, set, images] : {std::tuple{"train", &data.train, &data.train_images},
                                          std::tuple{"eval", &data.eval, &data.eval_images}})
    for (int64_t i = 0; i < set->size(); ++i) {
      if (!images->empty() && !(*images)[size_t(i)].empty()) continue;
      const int64_t start = set->offsets[size_t(i)];
      for (int64_t t = start; t < start + set->length(i); ++t)
        FAB_USER_CHECK(set->tokens[size_t(t)] != model.image_token_id,
                       "dataset {}: {} sequence {} holds the image token {} (<|image_pad|>) but no images: write "
                       "images with an <image> placeholder and an images column instead of the token itself",
                       c.dataset, name, i, model.image_token_id);
    }
}

// grpo, ppo: a rollout is a prompt and up to max_new_tokens more, within the model's context.
int64_t longest_rollout(const TrainConfig& c, const TokenSequences& train) {
  check_rollout_context(c, load_model_config((fs::path(c.model_name_or_path) / "config.json").string())
                               .max_position_embeddings, &train);
  return std::max<int64_t>(2, longest_prompt(train) + c.max_new_tokens);
}

int train_worker(TrainConfig c, WorldInfo world) {
  if (c.threads == 0 && world.local_size > 1)
    omp_set_num_threads(std::max(1, int(std::thread::hardware_concurrency()) / world.local_size));
  auto comm = join_world(world, double(c.ddp_timeout));
  // Rank 0 checks and locks output_dir before anybody writes; if it fails, its exit stops the job.
  std::optional<OutputDirLock> lock;
  if (world.rank == 0) {
    check_run_config(c);
    if (!OutputDirLock::held_by_launcher(c.output_dir)) lock.emplace(c.output_dir);
  }
  comm->barrier("configuration checked");
  const std::optional<AutoPlan> planned = plan_parallel_auto(c, *comm);  // parallel: auto sets the layout keys
  const ParallelLayout layout = layout_of_run(c, world.size);
  auto mesh = std::make_unique<DeviceMesh>(*comm, layout.sizes());
  const Device device = resolve_device(c.device);
  if (!device.is_host())
    mesh->set_device_collectives([device, timeout = double(c.ddp_timeout)](Communicator& group) {
      return device_collectives(group, device, timeout);
    });
  if (world.size > 1) start_rank_log(c.output_dir, world.rank);
  const Tokenizer tokenizer = Tokenizer::load(c.model_name_or_path);
  PreparedData data = prepare_on_node(c, tokenizer, world, *comm);
  const ModelConfig model_config = load_model_config((fs::path(c.model_name_or_path) / "config.json").string());
  check_images_fit_model(c, data, model_config);
  if (!c.do_train) return 0;
  DecoderOptions base;
  base.precision = c.bf16 ? Precision::bf16 : Precision::fp32;
  base.device = device;
  const bool rl = is_rollout(c.stage);
  base.max_seq_len = rl ? longest_rollout(c, data.train) : std::min(c.cutoff_len, longest_sequence(data));
  ModelShare share = model_share(base, layout, *mesh, c);  // its tensor-parallel ops outlive the model
  DecoderOptions& options = share.options;
  options.value_head = c.stage == Stage::rm;
  apply_finetuning(c, model_config.num_hidden_layers, options);
  apply_multimodal_freezing(c, model_config, options);
  auto model = load_model_folder(c.model_name_or_path, options, uint64_t(c.seed));
  load_initial_adapter(c, *model);
  FAB_USER_CHECK(tokenizer.vocab_size() <= model->config().vocab_size,
                 "the tokenizer has {} tokens but the model's vocab_size is {}", tokenizer.vocab_size(),
                 model->config().vocab_size);
  const bool main = world.rank == 0;
  if (main && !HfWeights::present(c.model_name_or_path))
    std::printf("model: %s has no weight files: the run starts from scratch (random initialisation, seed %lld)\n",
                c.model_name_or_path.c_str(), (long long)c.seed);
  if (main)
    std::printf("model: %s, %lld parameters, %s on %s, %d threads x %d processes, zero_stage %lld, "
                "tensor_parallel_size %d%s\n",
                model->config().model_type.c_str(), (long long)model->config().num_parameters(),
                c.bf16 ? "bf16" : "fp32", device.str().c_str(), omp_get_max_threads(), world.size,
                (long long)c.zero_stage, layout.tp,
                layout.sequence_parallel ? " (sequence parallel)" : "");
  if (main && (c.finetuning_type != "full" || model_config.vision))
    std::printf("finetuning: %s, %lld trainable parameters, %lld frozen\n", c.finetuning_type.c_str(),
                (long long)model->params().numel(), (long long)(model->frozen().numel() + model->frozen_bf16().numel()));
  const int32_t pad = tokenizer.pad_id().value_or(tokenizer.eos_id().value_or(0));
  bool finished = false;
  std::vector<StepRecord> history;
  {
    TrainData train_data{data.train, data.eval, pad, std::move(data.train_desirable), std::move(data.eval_desirable)};
    train_data.train_images = model_images(data.train_images);
    train_data.eval_images = model_images(data.eval_images);
    if (rl) train_data.rollout = rollout_environment(c, tokenizer);
    Trainer trainer(c, parallelize(std::move(model), mesh.get(), c), std::move(train_data));
    if (main) std::printf("training: %lld steps; MFU against %s\n", (long long)trainer.total_steps(), trainer.mfu_basis().c_str());
    if (main && c.stage == Stage::ppo && c.critic_warmup > trainer.total_steps())
      std::printf("warning: critic_warmup %lld is past the run's %lld steps: the actor never updates, only the "
                  "critic trains (saved to %s/critic); the final model is the starting one\n",
                  (long long)c.critic_warmup, (long long)trainer.total_steps(), c.output_dir.c_str());
    finished = trainer.run();
    history = trainer.history();
  }
  if (finished && planned && !history.empty())
    report_parallel_auto(*planned, history.back().step, measured_step_seconds(history), *comm, c.output_dir);
  if (finished && main) std::printf("done: model saved to %s\n", c.output_dir.c_str());
  share.tp.reset();
  mesh.reset();  // its groups before the world they were split from
  comm.reset();
  leave_world();
  return 0;
}

}  // namespace

int run_train(int argc, char** argv) {
  const TrainConfig c = config_from_args(argc, argv, 2, "fabrica train CONFIG.yaml [key=value ...]");
  const WorldInfo world = world_from_environment();
  // Only a process run by hand launches: a worker that mpirun (or srun) started, even as a world
  // of one (max_restarts with one process), trains under its launcher's lock.
  if (world.launcher == "none" && (c.nproc_per_node > 1 || !c.cluster.empty() || c.max_restarts > 0)) {
    const ClusterFile cluster = c.cluster.empty() ? ClusterFile{} : load_cluster_file(c.cluster);
    const int workers = checked_worker_count(c, cluster, usable_cores());  // before anything is written
    check_run_config(c);
    const OutputDirLock lock(c.output_dir);
    ::setenv(OutputDirLock::kHeldByLauncher, lock.path().c_str(), 1);
    return launch(c, cluster, workers, argc, argv);
  }
  return train_worker(c, world);
}

}  // namespace fab
