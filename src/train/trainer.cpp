#include "train/trainer.h"

#include <omp.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <algorithm>

#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>

#include "config/yaml_file.h"
#include "core/backend.h"
#include "core/error.h"
#include "core/file_write.h"
#include "core/stop_signals.h"
#include "core/trace.h"
#include "comm/world.h"
#include "kernels/cpu/machine_peak.h"
#include "models/hf_model.h"
#include "optim/lr_schedule.h"
#include "monitor/loss_plot.h"
#include "monitor/progress_bar.h"
#include "monitor/tensorboard.h"
#include "train/finetuning.h"
#include "monitor/metrics_log.h"

namespace fab {
namespace fs = std::filesystem;

namespace {

std::atomic<int> g_stop_signal{0};

// SIGINT/SIGTERM/SIGHUP (and SIGUSR1, what the launcher forwards through mpirun when it gets one)
// finish the current step, then the trainer saves and returns. The signal is taken on the
// watcher thread (core/stop_signals.h), never on a thread that computes.
struct StopOnSignal {
  StopSignalHandler handler{[](int signal) { g_stop_signal = signal; }};
  StopOnSignal() { g_stop_signal = 0; }
};

LrSchedule make_schedule(const TrainConfig& c, int64_t total, int64_t warmup) {
  LrSchedule s;
  s.type = c.lr_scheduler_type;
  s.base_lr = c.learning_rate;
  s.total_steps = total;
  s.warmup_steps = warmup;
  check_lr_schedule(s);
  return s;
}

// Keeps the metrics of steps <= `step` (a resumed run rewrites what came after its checkpoint).
void truncate_metrics(const std::string& output_dir, int64_t step) {
  const fs::path path = fs::path(output_dir) / "metrics.jsonl";
  if (!fs::exists(path)) return;
  std::ifstream in(path);
  std::string kept, line;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.contains("step") && j["step"].get<int64_t>() <= step) kept += line + "\n";
  }
  write_file_atomically(path.string(), kept);
}

// The settings that decide which samples each step sees. Resuming with other values goes on
// training, but no longer as the uninterrupted run would have: a note says what changed.
void note_changed_settings(const std::string& checkpoint, const TrainConfig& now) {
  const fs::path path = fs::path(checkpoint) / "train_config.yaml";
  if (!fs::exists(path)) return;
  std::string changes;
  const YAML::Node saved_config = load_yaml_file(path.string(), "the train_config.yaml its run saved");
  for (const auto& [key, value] : {std::pair{"per_device_train_batch_size", now.per_device_train_batch_size},
                                   std::pair{"gradient_accumulation_steps", now.gradient_accumulation_steps},
                                   std::pair{"seed", now.seed}}) {
    int64_t saved = value;
    try {
      saved = saved_config[key].as<int64_t>(value);
    } catch (const YAML::Exception& e) {
      throw UserError(format("{}: {}: expected an integer ({})", path.string(), key, e.what()));
    }
    if (saved != value) changes += format("{}{} {} -> {}", changes.empty() ? "" : ", ", key, saved, value);
  }
  if (!changes.empty())
    std::printf("note: resuming with %s: the steps from here see other batches than the interrupted run would have, "
                "so the result is no longer that run's exactly\n",
                changes.c_str());
}

}  // namespace

int64_t count_total_steps(const TrainConfig& c, int64_t batches_per_epoch) {
  if (c.max_steps > 0) return c.max_steps;
  const int64_t per_epoch = std::max<int64_t>(1, batches_per_epoch / c.gradient_accumulation_steps);
  const double steps = std::ceil(c.num_train_epochs * double(per_epoch));
  constexpr double kMostSteps = 0x1p53;  // counted exactly in a double, far beyond any run
  FAB_USER_CHECK(steps <= kMostSteps,
                 "num_train_epochs {} gives {} optimizer steps ({} per epoch); expected at most {} (set max_steps)",
                 c.num_train_epochs, steps, per_epoch, kMostSteps);
  return int64_t(steps);
}

Trainer::Trainer(TrainConfig config, std::unique_ptr<ParallelModel> model, TrainData data)
    : config_(std::move(config)),
      model_(std::move(model)),
      data_(std::move(data)),
      main_(model_->is_main()),
      optimizer_(config_, state_, is_rollout(config_.stage) ? format("stage {}: ", config_.stage) : "") {
  FAB_USER_CHECK(!config_.output_dir.empty(), "output_dir is required");
  data_.rollout.stop_signal = [] { return g_stop_signal.load(); };  // a stop ends a running reward command
  stage_ = make_training_stage({config_, *model_, data_, optimizer_});
  Communicator& group = model_->data_group();
  sampler_ = std::make_unique<Sampler>(stage_->items(), config_.per_device_train_batch_size, uint64_t(config_.seed),
                                       config_.shuffle, group.rank(), group.size());
  total_steps_ = count_total_steps(config_, sampler_->batches_per_epoch());
  warmup_steps_ = config_.warmup_steps > 0 ? config_.warmup_steps
                                           : int64_t(std::ceil(config_.warmup_ratio * double(total_steps_)));
  config_yaml_ = train_config_to_yaml(config_);
  set_mfu_peak();
}

// On CUDA, 989 TFLOP/s per process: the dense bf16 tensor-core peak of an H100/H200 SXM, against
// which MFU is quoted. On a CPU, this machine's measured peak (kernels/cpu/machine_peak.h), bf16 or
// fp32 as the run computes; every rank measures at once, as it will compute. FAB_PEAK_GFLOPS
// (GFLOP/s per process) overrides either.
void Trainer::set_mfu_peak() {
  const bool bf16 = model_->model().options().precision == Precision::bf16;
  const char* precision = bf16 ? "bf16" : "fp32";
  double gflops = 0;
  std::string source;
  if (model_->model().options().device.kind == DeviceKind::cuda) {
    const double given = peak_gflops_from_environment();
    gflops = given > 0 ? given : 989e3;
    source = given > 0 ? "FAB_PEAK_GFLOPS" : "the H100/H200 dense bf16 tensor-core peak";
  } else {
    const MachinePeak peak = machine_peak(omp_get_max_threads());
    gflops = bf16 ? peak.bf16_gflops : peak.fp32_gflops;
    source = peak.source;
  }
  peak_flops_per_process_ = gflops * 1e9;
  char figure[32];
  std::snprintf(figure, sizeof figure, "%.1f", gflops);
  mfu_basis_ = format("{} GFLOP/s {} per process, {}", figure, precision, source);
}

Trainer::~Trainer() = default;

void Trainer::agree_on_stop_and_save() {
  double flags[2] = {double(g_stop_signal != 0), double(main_ && timed_save_due())};
  model_->any_rank(flags, 2, "stop request and timed save");
  stop_requested_ = flags[0] > 0;
  save_due_ = flags[1] > 0;
}

namespace {
std::pair<int64_t, int64_t> traced_steps(const TrainConfig& c) {
  return c.trace_steps.empty() ? std::pair<int64_t, int64_t>{2, 4} : std::pair{c.trace_steps[0], c.trace_steps[1]};
}
}  // namespace

void Trainer::trace_before_step(int64_t step) {
  const auto [first, last] = traced_steps(config_);
  if (!config_.trace || step + 1 != first) return;
  trace::begin(world_from_environment().rank);
  trace::name_thread("compute");
  trace::set_recording(true);
}

void Trainer::trace_after_step(int64_t step) {
  const auto [first, last] = traced_steps(config_);
  if (!trace::recording() || (step + 1 != last && step + 1 != total_steps_)) return;
  trace::set_recording(false);
  const fs::path dir = fs::path(config_.output_dir) / "trace";
  fs::create_directories(dir);
  trace::write((dir / ("rank-" + std::to_string(world_from_environment().rank) + ".json")).string());
  if (main_) std::printf("trace: steps %lld to %lld in %s\n", (long long)first, (long long)(step + 1), dir.c_str());
}

// trace: true whose trace_steps the run never reaches (it ends before them, or resumed past them).
void Trainer::note_untraced_run() const {
  const auto [first, last] = traced_steps(config_);
  if (!config_.trace || !main_ || (first > state_.global_step && first <= total_steps_)) return;
  std::printf("note: trace: true, but this run trains steps %lld to %lld and tracing begins at step %lld "
              "(trace_steps [%lld, %lld]): no trace is written\n",
              (long long)(state_.global_step + 1), (long long)total_steps_, (long long)first, (long long)first,
              (long long)last);
}

bool Trainer::timed_save_due() const {
  return config_.save_every_minutes > 0 &&
         std::chrono::steady_clock::now() - last_save_ >= std::chrono::duration<double>(60 * config_.save_every_minutes);
}

double Trainer::evaluate() { return stage_->evaluate(); }

// Model FLOPs utilisation: 6N + 6 L T C FLOPs per token (trainer.h says why causal) against the
// peak set_mfu_peak chose, per process.
double training_flops_per_token(const ModelConfig& m, double mean_tokens, bool value_head) {
  const double table = double(m.vocab_size) * double(m.hidden_size);  // the embedding or the head
  // num_parameters counts a tied table once: as the head; an untied embedding is a lookup.
  double n = double(m.num_parameters()) - (m.tie_word_embeddings ? 0 : table);
  if (value_head) n += double(m.hidden_size) - table;  // the value head runs, the vocabulary head does not
  return 6 * n + 6.0 * double(m.num_hidden_layers) * mean_tokens * double(m.hidden_size);
}

double Trainer::mfu(double tokens_per_s) const {
  const ModelConfig& m = model_->model().config();
  const double t = double(data_.train.total_tokens()) / double(std::max<int64_t>(1, data_.train.size()));
  const double flops = training_flops_per_token(m, t, model_->model().options().value_head);
  return tokens_per_s * flops / (peak_flops_per_process_ * model_->processes());
}

// On a terminal: one line redrawn every step with a bar, loss, lr, tokens/s, MFU and ETA.
void Trainer::show_progress(int64_t step, double loss, double lr, double tokens_per_s, double elapsed) {
  if (!::isatty(STDOUT_FILENO)) return;
  const Progress p{step, total_steps_, first_step_, loss, lr, tokens_per_s, mfu(tokens_per_s), elapsed};
  std::printf("\r%s ", progress_line(p).c_str());
  std::fflush(stdout);
}

void Trainer::log_step(const StepRecord& r, double eval_loss) {
  const nlohmann::json parallel = model_->report(steps_since_log_);  // collective: every rank
  steps_since_log_ = 0;
  const nlohmann::json stage = stage_->metrics(std::isfinite(eval_loss));  // collective too
  if (!main_) return;
  nlohmann::json j = {{"step", r.step},          {"loss", r.loss},
                      {"lr", r.lr},              {"grad_norm", r.grad_norm},
                      {"tokens_per_s", r.tokens_per_s}, {"mfu", mfu(r.tokens_per_s)}, {"epoch", sampler_->epochs_done()},
                      {"skipped_steps", state_.skipped_steps()}, {"timing_s/step", r.step_seconds}};
  j.update(parallel);
  j.update(stage);
  const Device device = model_->model().options().device;
  if (!device.is_host()) j["device_peak_memory_bytes"] = backend(device.kind).allocator().total().peak;  // this rank's
  std::string eval_text;
  if (std::isfinite(eval_loss)) {
    j["eval_loss"] = eval_loss;
    eval_text = format("  eval_loss {}", eval_loss);
    if (stage_->token_loss()) {
      j["eval_perplexity"] = std::exp(eval_loss);
      eval_text += format("  eval_ppl {}", std::exp(eval_loss));
    }
  }
  metrics_->write(j.dump());
  if (tensorboard_) {
    tensorboard_->add_scalar("train/loss", r.loss, r.step);
    tensorboard_->add_scalar("train/learning_rate", r.lr, r.step);
    tensorboard_->add_scalar("train/grad_norm", r.grad_norm, r.step);
    if (std::isfinite(eval_loss)) tensorboard_->add_scalar("eval/loss", eval_loss, r.step);
  }
  std::printf("%sstep %lld/%lld  loss %.4f  lr %.3e  grad_norm %.3f  tokens/s %.0f  MFU %.1f%%%s\n",
              ::isatty(STDOUT_FILENO) ? "\r\033[K" : "", (long long)r.step, (long long)total_steps_, r.loss, r.lr,
              r.grad_norm, r.tokens_per_s, 100 * mfu(r.tokens_per_s), eval_text.c_str());
  std::fflush(stdout);
}

void Trainer::save(int64_t step) {
  trace::Scope traced(trace::kCheckpoint, "save " + checkpoint_name(step));
  last_save_ = std::chrono::steady_clock::now();
  state_.sampler = sampler_->state();
  const std::string dir = (fs::path(config_.output_dir) / checkpoint_name(step)).string();
  if (async_writer_)
    return async_writer_->save(dir, *model_, state_, config_yaml_, config_.model_name_or_path,
                               config_.save_total_limit, config_.save_only_model);
  save_checkpoint(dir, *model_, state_, config_yaml_, config_.model_name_or_path, config_.save_only_model);
  stage_->save_part(dir, state_, config_yaml_);
  if (main_) prune_checkpoints(config_.output_dir, config_.save_total_limit);
  model_->barrier("checkpoints pruned");
}

// A checkpoint saved by N ranks resumes on M: the sampler position counts this rank's share of
// the epoch's samples, so it scales by N / M.
void Trainer::resume(const std::string& checkpoint) {
  state_ = load_checkpoint(checkpoint, model_->data_parallel());
  FAB_USER_CHECK(state_.global_step <= total_steps_,
                 "resume_from_checkpoint: {} is at step {}, past this run's {} steps: there is nothing to train, and "
                 "its weights are not those of a {}-step run; set max_steps above {}, or resume from an earlier "
                 "checkpoint",
                 checkpoint, state_.global_step, total_steps_, total_steps_, state_.global_step);
  if (main_ && state_.global_step == total_steps_)
    std::printf("note: %s is at the run's last step %lld: nothing left to train; its weights become the final model\n",
                checkpoint.c_str(), (long long)total_steps_);
  stage_->load_part(checkpoint);
  const int64_t saved_world = state_.world_size, world = model_->data_group().size();
  if (saved_world != world) {
    const int64_t consumed = state_.sampler.position * saved_world;
    state_.sampler.position = consumed / world;
    if (main_ && consumed % world != 0)
      std::printf("note: the checkpoint was saved by %lld ranks; %lld samples of its epoch do not divide among %lld\n",
                  (long long)saved_world, (long long)consumed, (long long)world);
  }
  sampler_->restore(state_.sampler);
  if (main_) note_changed_settings(checkpoint, config_);
  if (main_) truncate_metrics(config_.output_dir, state_.global_step);
  model_->barrier("resumed");
  if (main_) std::printf("resumed from %s at step %lld\n", checkpoint.c_str(), (long long)state_.global_step);
}

bool Trainer::run() {
  StopOnSignal signals;
  const LrSchedule schedule = make_schedule(config_, total_steps_, warmup_steps_);
  const std::string checkpoint = checkpoint_to_resume(config_.resume_from_checkpoint, config_.output_dir);
  const bool resuming = !checkpoint.empty();
  stage_->prepare();  // a reference is the starting weights: before a resume replaces them
  if (resuming) resume(checkpoint);
  note_untraced_run();
  // Only now: a resume that fails leaves the earlier run's train_config.yaml as it was.
  if (main_) {
    fs::create_directories(config_.output_dir);
    write_file_atomically((fs::path(config_.output_dir) / "train_config.yaml").string(), config_yaml_);
  }
  if (main_) metrics_ = std::make_unique<MetricsLog>(config_.output_dir, resuming);
  if (main_ && config_.report_to == "tensorboard")
    tensorboard_ = std::make_unique<TensorBoardWriter>((fs::path(config_.output_dir) / "runs").string());
  auto window_start = std::chrono::steady_clock::now();
  const auto run_start = window_start;
  first_step_ = state_.global_step;
  last_save_ = run_start;
  if (config_.async_save) async_writer_ = std::make_unique<AsyncCheckpointWriter>(std::chrono::seconds(config_.ddp_timeout));
  int64_t window_tokens = 0, run_tokens = 0;
  for (int64_t step = state_.global_step; step < total_steps_; ++step) {
    double grad_norm = 0;
    const double lr = schedule.lr(step);
    const int64_t tokens_before = window_tokens;
    if (async_writer_) async_writer_->check();  // a background write that failed stops the run here
    trace_before_step(step);
    double loss = 0;
    {
      trace::Scope traced(trace::kStep, "step " + std::to_string(step + 1));
      const StepResult r = stage_->step(step, lr, *sampler_);
      loss = optimizer_.take_skipped() ? NAN : r.loss;
      grad_norm = r.grad_norm;
      window_tokens += r.tokens;
      agree_on_stop_and_save();
    }
    run_tokens += window_tokens - tokens_before;
    ++steps_since_log_;
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count();
    if (main_) show_progress(step + 1, loss, lr, double(run_tokens) / elapsed, elapsed);
    state_.losses.push_back(loss);
    state_.global_step = step + 1;
    const bool last = step + 1 == total_steps_;
    const bool eval_now = config_.eval_strategy == "steps" && config_.eval_steps > 0 &&
                          (step + 1) % config_.eval_steps == 0;
    if ((step + 1) % config_.logging_steps == 0 || last || eval_now) {
      // The logged loss is the mean over the steps since the previous log, taken from the saved
      // per-step losses, so a resumed run logs exactly what the uninterrupted one did.
      const int64_t first = (step / config_.logging_steps) * config_.logging_steps;
      double sum = 0, counted = 0;  // steps skipped under nan_policy skip do not count
      for (int64_t s = first; s <= step; ++s)
        if (std::isfinite(state_.losses[size_t(s)])) sum += state_.losses[size_t(s)], ++counted;
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - window_start).count();
      StepRecord r{step + 1, counted > 0 ? sum / counted : NAN, lr, grad_norm, double(window_tokens) / seconds,
                   seconds / double(std::max<int64_t>(1, steps_since_log_))};
      history_.push_back(r);
      log_step(r, eval_now || (last && config_.eval_strategy != "no") ? evaluate() : NAN);
      window_start = std::chrono::steady_clock::now();
      window_tokens = 0;
    }
    if (((config_.save_steps > 0 && (step + 1) % config_.save_steps == 0) || save_due_) && !last) save(step + 1);
    trace_after_step(step);
    if (stop_requested_) {
      save(step + 1);
      if (async_writer_) async_writer_->wait();
      if (main_)
        std::printf("stopped by signal %d after step %lld; checkpoint saved%s\n", int(g_stop_signal), (long long)(step + 1),
                    config_.save_only_model ? " (save_only_model: the weights only, not resumable)" : "");
      return false;
    }
  }
  if (async_writer_) async_writer_->wait();
  finish();
  return true;
}

// The trained model as an HF folder in output_dir, with the tokenizer files copied beside it.
void Trainer::finish() {
  model_->save_trained_model(config_.output_dir, config_.model_name_or_path);
  stage_->save_final(config_.output_dir);
  model_->barrier("final model written");
  if (!main_) return;
  if (config_.plot_loss) {
    std::vector<double> steps, losses;
    for (const StepRecord& r : history_) steps.push_back(double(r.step)), losses.push_back(r.loss);
    write_loss_plot((fs::path(config_.output_dir) / "training_loss.svg").string(), steps, losses,
                    "training loss of " + config_.output_dir);
  }
  copy_tokenizer_and_template_files(config_.model_name_or_path, config_.output_dir);
}

}  // namespace fab
