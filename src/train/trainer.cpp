#include "train/trainer.h"

#include <omp.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "models/hf_model.h"
#include "optim/adamw.h"
#include "optim/lr_schedule.h"
#include "monitor/loss_plot.h"
#include "monitor/tensorboard.h"
#include "train/metrics_log.h"

namespace fab {
namespace fs = std::filesystem;

namespace {

std::atomic<int> g_stop_signal{0};
extern "C" void request_stop(int signal) { g_stop_signal = signal; }

// SIGINT/SIGTERM finish the current step, then the trainer saves and returns.
struct StopOnSignal {
  void (*old_int)(int), (*old_term)(int);
  StopOnSignal() : old_int(std::signal(SIGINT, request_stop)), old_term(std::signal(SIGTERM, request_stop)) {
    g_stop_signal = 0;
  }
  ~StopOnSignal() {
    std::signal(SIGINT, old_int);
    std::signal(SIGTERM, old_term);
  }
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
  std::ofstream(path) << kept;
}

}  // namespace

int64_t count_total_steps(const TrainConfig& c, int64_t batches_per_epoch) {
  if (c.max_steps > 0) return c.max_steps;
  const int64_t per_epoch = std::max<int64_t>(1, batches_per_epoch / c.gradient_accumulation_steps);
  return int64_t(std::ceil(c.num_train_epochs * double(per_epoch)));
}

Trainer::Trainer(TrainConfig config, std::unique_ptr<DecoderModel> model, TrainData data)
    : config_(std::move(config)), model_(std::move(model)), data_(std::move(data)) {
  FAB_USER_CHECK(!config_.output_dir.empty(), "output_dir is required");
  optimizer_ = std::make_unique<AdamW>(
      model_->params(), AdamWConfig{float(config_.adam_beta1), float(config_.adam_beta2), float(config_.adam_epsilon),
                                    float(config_.weight_decay)});
  sampler_ = std::make_unique<Sampler>(data_.train.size(), config_.per_device_train_batch_size, uint64_t(config_.seed),
                                       config_.shuffle);
  total_steps_ = count_total_steps(config_, sampler_->batches_per_epoch());
  warmup_steps_ = config_.warmup_steps > 0 ? config_.warmup_steps
                                           : int64_t(std::ceil(config_.warmup_ratio * double(total_steps_)));
  config_yaml_ = train_config_to_yaml(config_);
}

Trainer::~Trainer() = default;

// One optimizer step: the loss of every micro-batch is normalised by the target count of the
// whole step, as HF does (num_items_in_batch), so accumulation equals one big batch.
double Trainer::train_step(int64_t step, double lr, double* grad_norm, int64_t* tokens) {
  std::vector<Batch> micro;
  int64_t targets = 0;
  for (int64_t m = 0; m < config_.gradient_accumulation_steps; ++m) {
    micro.push_back(collate(data_.train, sampler_->next_batch(), data_.pad_id, config_.neat_packing));
    targets += DecoderModel::count_targets(micro.back().labels);
    *tokens += micro.back().tokens;
  }
  model_->params().grads().zero_();
  double loss_sum = 0;
  const float scale = targets > 0 ? 1.0f / float(targets) : 0.0f;
  for (const Batch& b : micro)
    loss_sum += model_->forward_backward(b.ids, b.labels, scale, {b.positions, b.doc_start});
  const double loss = targets > 0 ? loss_sum / double(targets) : 0.0;
  FAB_USER_CHECK(std::isfinite(loss), "loss is {} at step {}: stopping (lower learning_rate, check the data)", loss,
                 step + 1);
  *grad_norm = clip_grad_norm(model_->params(), config_.max_grad_norm);
  FAB_USER_CHECK(std::isfinite(*grad_norm), "gradient norm is {} at step {}: stopping", *grad_norm, step + 1);
  optimizer_->step(float(lr));
  return loss;
}

double Trainer::evaluate() {
  if (data_.eval.size() == 0) return NAN;
  double loss = 0;
  int64_t targets = 0;
  for (int64_t start = 0; start < data_.eval.size(); start += config_.per_device_eval_batch_size) {
    std::vector<int64_t> idx;
    for (int64_t i = start; i < std::min(data_.eval.size(), start + config_.per_device_eval_batch_size); ++i)
      idx.push_back(i);
    Batch b = collate(data_.eval, idx, data_.pad_id, config_.neat_packing);
    loss += model_->loss_sum(b.ids, b.labels, {b.positions, b.doc_start});
    targets += DecoderModel::count_targets(b.labels);
  }
  return targets ? loss / double(targets) : NAN;
}

// Model FLOPs utilisation: 6N + 12 L T C FLOPs per token (N = parameters in matmuls, T = mean
// sample length) against FAB_PEAK_GFLOPS, or 157.5 GFLOP/s per thread (the fp32 FMA peak
// measured on the 2-core reference machine) when unset.
double Trainer::mfu(double tokens_per_s) const {
  const ModelConfig& m = model_->config();
  const double n = double(m.num_parameters() - m.vocab_size * m.hidden_size * (m.tie_word_embeddings ? 0 : 1));
  const double t = double(data_.train.total_tokens()) / double(std::max<int64_t>(1, data_.train.size()));
  const double flops = 6 * n + 12.0 * double(m.num_hidden_layers) * t * double(m.hidden_size);
  const char* peak_env = std::getenv("FAB_PEAK_GFLOPS");
  const double peak = (peak_env ? std::atof(peak_env) : 157.5 * omp_get_max_threads()) * 1e9;
  return tokens_per_s * flops / peak;
}

// On a terminal: one line redrawn every step with a bar, loss, lr, tokens/s, MFU and ETA.
void Trainer::show_progress(int64_t step, double loss, double lr, double tokens_per_s, double elapsed) {
  if (!::isatty(STDOUT_FILENO)) return;
  const int width = 24, filled = int(width * double(step) / double(total_steps_));
  const double eta = elapsed / double(step - first_step_) * double(total_steps_ - step);
  std::printf("\r%lld/%lld [%s%s] loss %.4f lr %.2e tok/s %.0f MFU %.0f%% ETA %dm%02ds ", (long long)step,
              (long long)total_steps_, std::string(size_t(filled), '#').c_str(),
              std::string(size_t(width - filled), ' ').c_str(), loss, lr, tokens_per_s, 100 * mfu(tokens_per_s),
              int(eta) / 60, int(eta) % 60);
  std::fflush(stdout);
}

void Trainer::log_step(const StepRecord& r, double eval_loss) {
  nlohmann::json j = {{"step", r.step},          {"loss", r.loss},
                      {"lr", r.lr},              {"grad_norm", r.grad_norm},
                      {"tokens_per_s", r.tokens_per_s}, {"mfu", mfu(r.tokens_per_s)}, {"epoch", double(state_.sampler.epoch) +
                                                              double(state_.sampler.position) /
                                                                  double(std::max<int64_t>(1, data_.train.size()))}};
  std::string eval_text;
  if (std::isfinite(eval_loss)) {
    j["eval_loss"] = eval_loss;
    j["eval_perplexity"] = std::exp(eval_loss);
    eval_text = format("  eval_loss {}  eval_ppl {}", eval_loss, std::exp(eval_loss));
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
  state_.sampler = sampler_->state();
  const std::string dir = (fs::path(config_.output_dir) / ("checkpoint-" + std::to_string(step))).string();
  save_checkpoint(dir, *model_, *optimizer_, state_, config_yaml_);
  prune_checkpoints(config_.output_dir, config_.save_total_limit);
}

bool Trainer::run() {
  StopOnSignal signals;
  fs::create_directories(config_.output_dir);
  std::ofstream(fs::path(config_.output_dir) / "train_config.yaml") << config_yaml_;
  const LrSchedule schedule = make_schedule(config_, total_steps_, warmup_steps_);
  std::string resume = config_.resume_from_checkpoint;
  if (resume == "true" || resume == "True") resume = latest_checkpoint(config_.output_dir);
  const bool resuming = !resume.empty() && resume != "false" && resume != "False";
  if (resuming) {
    state_ = load_checkpoint(resume, *model_, *optimizer_);
    sampler_->restore(state_.sampler);
    truncate_metrics(config_.output_dir, state_.global_step);
    std::printf("resumed from %s at step %lld\n", resume.c_str(), (long long)state_.global_step);
  }
  metrics_ = std::make_unique<MetricsLog>(config_.output_dir, resuming);
  if (config_.report_to == "tensorboard")
    tensorboard_ = std::make_unique<TensorBoardWriter>((fs::path(config_.output_dir) / "runs").string());
  auto window_start = std::chrono::steady_clock::now();
  const auto run_start = window_start;
  first_step_ = state_.global_step;
  int64_t window_tokens = 0, run_tokens = 0;
  for (int64_t step = state_.global_step; step < total_steps_; ++step) {
    double grad_norm = 0;
    const double lr = schedule.lr(step);
    const int64_t tokens_before = window_tokens;
    const double loss = train_step(step, lr, &grad_norm, &window_tokens);
    run_tokens += window_tokens - tokens_before;
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count();
    show_progress(step + 1, loss, lr, double(run_tokens) / elapsed, elapsed);
    state_.losses.push_back(loss);
    state_.global_step = step + 1;
    const bool last = step + 1 == total_steps_;
    const bool eval_now = config_.eval_strategy == "steps" && config_.eval_steps > 0 &&
                          (step + 1) % config_.eval_steps == 0;
    if ((step + 1) % config_.logging_steps == 0 || last || eval_now) {
      // The logged loss is the mean over the steps since the previous log, taken from the saved
      // per-step losses, so a resumed run logs exactly what the uninterrupted one did.
      const int64_t first = (step / config_.logging_steps) * config_.logging_steps;
      double sum = 0;
      for (int64_t s = first; s <= step; ++s) sum += state_.losses[size_t(s)];
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - window_start).count();
      StepRecord r{step + 1, sum / double(step + 1 - first), lr, grad_norm, double(window_tokens) / seconds};
      history_.push_back(r);
      log_step(r, eval_now || (last && config_.eval_strategy != "no") ? evaluate() : NAN);
      window_start = std::chrono::steady_clock::now();
      window_tokens = 0;
    }
    if (config_.save_steps > 0 && (step + 1) % config_.save_steps == 0 && !last) save(step + 1);
    if (g_stop_signal) {
      save(step + 1);
      std::printf("stopped by signal %d after step %lld; checkpoint saved\n", int(g_stop_signal), (long long)(step + 1));
      return false;
    }
  }
  finish();
  return true;
}

// The trained model as an HF folder in output_dir, with the tokenizer files copied beside it.
void Trainer::finish() {
  save_model_folder(*model_, config_.output_dir);
  if (config_.plot_loss) {
    std::vector<double> steps, losses;
    for (const StepRecord& r : history_) steps.push_back(double(r.step)), losses.push_back(r.loss);
    write_loss_plot((fs::path(config_.output_dir) / "training_loss.svg").string(), steps, losses,
                    "training loss of " + config_.output_dir);
  }
  for (const char* name : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                           "vocab.json", "merges.txt", "generation_config.json"}) {
    const fs::path src = fs::path(config_.model_name_or_path) / name;
    if (fs::exists(src)) fs::copy_file(src, fs::path(config_.output_dir) / name, fs::copy_options::overwrite_existing);
  }
}

}  // namespace fab
