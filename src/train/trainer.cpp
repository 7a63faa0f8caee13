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

#include "core/backend.h"
#include "core/error.h"
#include "core/file_write.h"
#include "core/stop_signals.h"
#include "core/trace.h"
#include "comm/world.h"
#include "models/hf_model.h"
#include "optim/lr_schedule.h"
#include "parallel/parallelize.h"
#include "parallel/tensor_parallel.h"
#include "monitor/loss_plot.h"
#include "monitor/progress_bar.h"
#include "monitor/tensorboard.h"
#include "train/finetuning.h"
#include "train/metrics_log.h"

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
  YAML::Node saved_config;
  try {
    saved_config = YAML::LoadFile(path.string());
  } catch (const YAML::Exception& e) {
    throw UserError(format("{}: not valid YAML ({})", path.string(), e.what()));
  }
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

Batch collate_traced(const TokenSequences& set, const std::vector<int64_t>& samples, int32_t pad, bool neat_packing) {
  trace::Scope traced(trace::kData, "collate");
  return collate(set, samples, pad, neat_packing);
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

Trainer::Trainer(TrainConfig config, std::unique_ptr<DecoderModel> model, TrainData data, DeviceMesh* mesh)
    : config_(std::move(config)), model_(std::move(model)), data_(std::move(data)) {
  FAB_USER_CHECK(!config_.output_dir.empty(), "output_dir is required");
  if (!mesh) {  // training alone: a mesh of one
    own_world_ = std::make_unique<LocalCommunicator>();
    own_mesh_ = std::make_unique<DeviceMesh>(*own_world_, ParallelSizes{});
    mesh = own_mesh_.get();
  }
  group_ = &mesh->group("dp");
  ParallelModel parallel = parallelize(*model_, *mesh, config_);
  tp_ = parallel.tp;
  pipeline_ = std::move(parallel.pipeline);
  dp_ = std::move(parallel.dp);
  main_ = group_->rank() == 0 && (!tp_ || tp_->rank() == 0) && (!pipeline_ || pipeline_->stage() == 0);
  objective_ = make_stage_objective(
      config_, StageData{&data_.train, &data_.eval, &data_.train_desirable, &data_.eval_desirable, data_.pad_id});
  data_.grpo.stop_signal = [] { return g_stop_signal.load(); };  // a stop ends a running reward command
  if (config_.stage == Stage::grpo)
    grpo_ = std::make_unique<GrpoStage>(config_, *model_, *dp_, *group_, data_.train, data_.grpo, data_.pad_id);
  if (config_.stage == Stage::ppo)
    grpo_ = std::make_unique<PpoStage>(config_, *model_, *dp_, *group_, data_.train, data_.grpo, data_.pad_id);
  if (objective_) {
    train_metrics_ = std::make_unique<StageMetrics>(objective_->metric_names());
    eval_metrics_ = std::make_unique<StageMetrics>(objective_->metric_names());
  }
  const int64_t items = objective_ ? objective_->items(data_.train) : data_.train.size();
  sampler_ = std::make_unique<Sampler>(items, config_.per_device_train_batch_size, uint64_t(config_.seed),
                                       config_.shuffle, group_->rank(), group_->size());
  total_steps_ = count_total_steps(config_, sampler_->batches_per_epoch());
  warmup_steps_ = config_.warmup_steps > 0 ? config_.warmup_steps
                                           : int64_t(std::ceil(config_.warmup_ratio * double(total_steps_)));
  config_yaml_ = train_config_to_yaml(config_);
}

Trainer::~Trainer() = default;

// Every rank of the job: the data-parallel group's barrier, then the tensor-parallel group's or
// the pipeline's.
void Trainer::barrier_all(const std::string& what) {
  group_->barrier(what);
  if (tp_) tp_->barrier(what);
  if (pipeline_) pipeline_->group().barrier(what);
}

// The targets and tokens of this rank's next `micro_batches` micro-batches, counted on a copy of
// the sampler: each batch is collated, counted and dropped, so memory holds one micro-batch
// however many the step accumulates. A preference stage's loss is a mean over its items (pairs,
// examples): they are its targets.
std::pair<double, double> Trainer::count_step(int64_t micro_batches) const {
  trace::Scope traced(trace::kData, "count the step's targets");
  Sampler ahead = *sampler_;
  double targets = 0, tokens = 0;
  for (int64_t m = 0; m < micro_batches; ++m) {
    if (objective_) {
      for (int64_t item : ahead.next_batch()) {
        targets += 1;
        tokens += double(data_.train.length(2 * item) + data_.train.length(2 * item + 1));
      }
      continue;
    }
    const Batch b = collate(data_.train, ahead.next_batch(), data_.pad_id, config_.neat_packing);
    targets += double(DecoderModel::count_targets(b.labels));
    tokens += double(b.tokens);
  }
  return {targets, tokens};
}

// One optimizer step: the loss of every micro-batch on every rank is normalised by the target
// count of the whole global step, as HF does (num_items_in_batch), so accumulation and data
// parallelism both equal one big batch. Micro-batches are collated when they are used.
double Trainer::train_step(int64_t step, double lr, double* grad_norm, int64_t* tokens) {
  if (grpo_) return grpo_train_step(step, lr, grad_norm, tokens);
  const int64_t micro_batches = config_.gradient_accumulation_steps;
  const auto [my_targets, my_tokens] = count_step(micro_batches);
  double counts[2] = {my_targets, my_tokens};  // summed over the group
  group_->all_reduce(counts, 2, "target count").wait();
  const double targets = counts[0];
  *tokens += int64_t(counts[1]);
  dp_->begin_step(micro_batches);
  // The loss sum; any rank asked to stop; a timed save is due on rank 0's clock; then one flag per
  // rank: its own loss sum is not finite.
  std::vector<double> sums(size_t(3 + group_->size()), 0.0);
  sums[1] = double(g_stop_signal != 0);
  sums[2] = double(main_ && timed_save_due());
  const float scale = targets > 0 ? float(1.0 / targets) : 0.0f;
  if (pipeline_) {
    sums[0] = pipeline_step(micro_batches, scale);
  } else {
    for (int64_t m = 0; m < micro_batches; ++m) {
      dp_->begin_micro_batch(m);
      // LoRA dropout masks: one stream per (seed, rank, micro-batch of the run), so a resumed run draws the same.
      model_->set_dropout_seed((uint64_t(config_.seed) * 1000003u + uint64_t(group_->rank())) * 0x100000001b3ull +
                               uint64_t(step * micro_batches + m));
      sums[0] += micro_batch(scale);
    }
  }
  sums[size_t(3 + group_->rank())] = double(!std::isfinite(sums[0]));
  dp_->finish_gradients();
  if (pipeline_) pipeline_->sum_tied_gradients();
  group_->all_reduce(sums.data(), int64_t(sums.size()), "loss").wait();  // tp peers hold the same loss sums
  // The loss is the last stage's; every stage learns it (and any stage's flags).
  if (pipeline_) pipeline_->group().all_reduce(sums.data(), int64_t(sums.size()), "loss over the pipeline").wait();
  if (tp_) tp_->all_reduce(&sums[1], 2, "stop request and timed save").wait();
  stop_requested_ = sums[1] > 0;  // every rank stops after the same step
  save_due_ = sums[2] > 0;
  std::string ranks;
  for (int r = 0; r < group_->size(); ++r)
    if (sums[size_t(3 + r)] > 0) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  *grad_norm = NAN;
  if (!ranks.empty()) return skip_or_stop(step, format("the loss is not finite on rank {}", ranks));
  *grad_norm = dp_->clip_grad_norm(config_.max_grad_norm);
  if (!std::isfinite(*grad_norm))
    return skip_or_stop(step, format("the gradient norm (of the gradients summed over every rank) is {}",
                                     std::isnan(*grad_norm) ? "NaN" : "infinite"));
  dp_->optimizer_step(float(lr));
  return targets > 0 ? sums[0] / targets : 0.0;
}

// stage grpo: the stop and timed-save flags agreed over the ranks, then the stage's rollouts and
// optimizer updates (it checks their losses and gradient norms itself).
double Trainer::grpo_train_step(int64_t step, double lr, double* grad_norm, int64_t* tokens) {
  double flags[2] = {double(g_stop_signal != 0), double(main_ && timed_save_due())};
  group_->all_reduce(flags, 2, "stop request and timed save").wait();
  stop_requested_ = flags[0] > 0;
  save_due_ = flags[1] > 0;
  model_->set_dropout_seed((uint64_t(config_.seed) * 1000003u + uint64_t(group_->rank())) * 0x100000001b3ull +
                           uint64_t(step));
  const GrpoStepResult r = grpo_->step(step, sampler_->next_batch(), lr);
  *grad_norm = r.grad_norm;
  *tokens += r.tokens;
  return r.loss;
}

double Trainer::skip_or_stop(int64_t step, const std::string& what) {
  const std::string last = latest_checkpoint(config_.output_dir);
  const std::string kept = last.empty() ? "no checkpoint was saved before it" : "the last checkpoint is " + last;
  FAB_USER_CHECK(config_.nan_policy == "skip",
                 "step {}: {}: stopping, saving nothing new (nan_policy: stop); {}. Lower learning_rate, check the "
                 "data, or set nan_policy: skip",
                 step + 1, what, kept);
  const int64_t skipped = 1 + state_.skipped_steps();
  FAB_USER_CHECK(skipped <= config_.max_skipped_steps,
                 "step {}: {}: {} optimizer steps skipped, more than max_skipped_steps {}: stopping, saving nothing "
                 "new; {}",
                 step + 1, what, skipped, config_.max_skipped_steps, kept);
  if (main_)
    std::printf("step %lld: %s: optimizer step skipped (nan_policy: skip, %lld of at most %lld)\n",
                (long long)(step + 1), what.c_str(), (long long)skipped, (long long)config_.max_skipped_steps);
  return NAN;
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

// Pipeline parallel: the step's micro-batches (each stage collates the same ones: the first
// embeds their ids, the last takes their labels, every stage their packing layout) through the
// schedule. Memory holds the step's micro-batches of ids, next to the activations in flight.
double Trainer::pipeline_step(int64_t micro_batches, float scale) {
  std::vector<PipelineMicroBatch> batches;
  for (int64_t m = 0; m < micro_batches; ++m) {
    const Batch b = collate_traced(data_.train, sampler_->next_batch(), data_.pad_id, config_.neat_packing);
    batches.push_back({b.ids, b.labels, {b.positions, b.doc_start}});
  }
  return pipeline_->forward_backward(batches, scale, *dp_);
}

double Trainer::eval_loss_sum(const Tensor& ids, const Tensor& labels, const SequenceLayout& layout) {
  return pipeline_ ? pipeline_->loss_sum({ids, labels, layout}) : model_->loss_sum(ids, labels, layout);
}

// Forward and backward of this rank's next micro-batch; returns its loss sum.
double Trainer::micro_batch(float loss_scale) {
  if (objective_)
    return objective_->step(*model_, DataSplit::train, sampler_->next_batch(), loss_scale, true, *train_metrics_,
                            *group_);
  const Batch b = collate_traced(data_.train, sampler_->next_batch(), data_.pad_id, config_.neat_packing);
  return model_->forward_backward(b.ids, b.labels, loss_scale, {b.positions, b.doc_start});
}

// A preference stage's evaluation: its mean loss over the evaluation items and its metrics, the
// batches dealt to the ranks as in evaluate(); a rank without a batch in the last round runs item
// 0 and drops the result.
double Trainer::evaluate_stage() {
  eval_metrics_->clear();
  StageMetrics dropped(objective_->metric_names());
  double sums[2] = {0, 0};  // loss, items
  const int64_t items = objective_->items(data_.eval), batch = config_.per_device_eval_batch_size;
  const int64_t ranks = group_->size(), batches = (items + batch - 1) / batch, rounds = (batches + ranks - 1) / ranks;
  for (int64_t round = 0; round < rounds; ++round) {
    const int64_t start = (round * ranks + group_->rank()) * batch;
    std::vector<int64_t> idx;
    for (int64_t i = start; i < std::min(items, start + batch); ++i) idx.push_back(i);
    const bool none = idx.empty();
    const double loss = objective_->step(*model_, DataSplit::eval, none ? std::vector<int64_t>{0} : idx, 1.0f, false,
                                         none ? dropped : *eval_metrics_, *group_);
    if (!none) sums[0] += loss, sums[1] += double(idx.size());
  }
  dp_->release_gathered_parameters();
  group_->all_reduce(sums, 2, "evaluation loss").wait();
  eval_metrics_->all_reduce(*group_);
  return sums[1] > 0 ? sums[0] / sums[1] : NAN;
}

// The preference stage's metrics since the last log (and of the evaluation just run): collective.
nlohmann::json Trainer::stage_metrics(double eval_loss) {
  if (grpo_) {
    nlohmann::json j = grpo_->metrics_json();
    j.update(grpo_->memory_json());
    return j;
  }
  if (!objective_) return nlohmann::json::object();
  train_metrics_->all_reduce(*group_);
  nlohmann::json j = objective_->metrics_json(*train_metrics_, "");
  train_metrics_->clear();
  if (std::isfinite(eval_loss)) j.update(objective_->metrics_json(*eval_metrics_, "eval_"));
  j.update(objective_->memory_json());
  return j;
}

// Mean loss over the evaluation set (no gradients); each rank takes every N-th batch. Every rank
// runs the same number of forward passes (ZeRO-3 gathers parameters in each): one without a
// batch of its own in the last round runs a one-token pass with no target, which adds nothing.
double Trainer::evaluate() {
  if (data_.eval.size() == 0) return NAN;
  if (objective_) return evaluate_stage();
  double sums[2] = {0, 0};  // loss, targets
  const int64_t batch = config_.per_device_eval_batch_size, ranks = group_->size();
  const int64_t batches = (data_.eval.size() + batch - 1) / batch, rounds = (batches + ranks - 1) / ranks;
  for (int64_t round = 0; round < rounds; ++round) {
    const int64_t start = (round * ranks + group_->rank()) * batch;
    if (start >= data_.eval.size()) {
      Tensor none = Tensor::zeros({1, 1}, DType::i64, MemoryCategory::activations);
      none.data<int64_t>()[0] = -100;
      eval_loss_sum(Tensor::zeros({1, 1}, DType::i64, MemoryCategory::activations), none, {});
      continue;
    }
    std::vector<int64_t> idx;
    for (int64_t i = start; i < std::min(data_.eval.size(), start + batch); ++i) idx.push_back(i);
    Batch b = collate(data_.eval, idx, data_.pad_id, config_.neat_packing);
    sums[0] += eval_loss_sum(b.ids, b.labels, {b.positions, b.doc_start});
    sums[1] += double(DecoderModel::count_targets(b.labels));
  }
  dp_->release_gathered_parameters();
  group_->all_reduce(sums, 2, "evaluation loss").wait();
  if (pipeline_) pipeline_->group().all_reduce(sums, 1, "evaluation loss over the pipeline").wait();
  return sums[1] > 0 ? sums[0] / sums[1] : NAN;
}

// Model FLOPs utilisation: 6N + 12 L T C FLOPs per token (N = parameters in matmuls, T = mean
// sample length) against FAB_PEAK_GFLOPS per process; unset, 157.5 GFLOP/s per thread (the fp32
// FMA peak measured on the 2-core reference machine), or on CUDA 989 TFLOP/s (the dense bf16
// tensor-core peak of an H100/H200 SXM, against which MFU is quoted).
double training_flops_per_token(const ModelConfig& m, double mean_tokens, bool value_head) {
  const double table = double(m.vocab_size) * double(m.hidden_size);  // the embedding or the head
  // num_parameters counts a tied table once: as the head; an untied embedding is a lookup.
  double n = double(m.num_parameters()) - (m.tie_word_embeddings ? 0 : table);
  if (value_head) n += double(m.hidden_size) - table;  // the value head runs, the vocabulary head does not
  return 6 * n + 12.0 * double(m.num_hidden_layers) * mean_tokens * double(m.hidden_size);
}

double Trainer::mfu(double tokens_per_s) const {
  const ModelConfig& m = model_->config();
  const double t = double(data_.train.total_tokens()) / double(std::max<int64_t>(1, data_.train.size()));
  const double flops = training_flops_per_token(m, t, model_->options().value_head);
  const char* peak_env = std::getenv("FAB_PEAK_GFLOPS");
  const int processes = group_->size() * (tp_ ? tp_->size() : 1) * (pipeline_ ? pipeline_->num_stages() : 1);
  const double default_peak = model_->options().device.kind == DeviceKind::cuda ? 989e3 : 157.5 * omp_get_max_threads();
  const double peak = (peak_env ? std::atof(peak_env) : default_peak) * 1e9 * processes;
  return tokens_per_s * flops / peak;
}

// Parallel figures since the last log: the model-state bytes of every rank of the mesh, the bytes
// this rank sent per step over the data-parallel group (and over the tensor-parallel one), and the
// fraction of data-parallel communication time hidden behind computation.
nlohmann::json Trainer::parallel_metrics() {
  const ModelStateBytes mine = dp_->state_bytes();
  // One slot per rank of the mesh, in world-rank order (tp fastest, then dp, then the stages).
  const int tp = tp_ ? tp_->size() : 1, stages = pipeline_ ? pipeline_->num_stages() : 1;
  const int ranks = group_->size() * tp * stages, stage = pipeline_ ? pipeline_->stage() : 0;
  const size_t slot = size_t((stage * group_->size() + group_->rank()) * tp + (tp_ ? tp_->rank() : 0));
  std::vector<double> bytes(size_t(3 * ranks), 0.0);
  bytes[3 * slot] = double(mine.parameters);
  bytes[3 * slot + 1] = double(mine.gradients);
  bytes[3 * slot + 2] = double(mine.optimizer_state);
  const CommStats now = dp_->comm_stats();
  const double sent = double(now.bytes_sent - comm_at_last_log_.bytes_sent) / double(std::max<int64_t>(1, steps_since_log_));  // dp
  const double busy = now.busy_seconds - comm_at_last_log_.busy_seconds;
  const double blocked = now.blocked_seconds - comm_at_last_log_.blocked_seconds;
  const int64_t steps = std::max<int64_t>(1, steps_since_log_);
  const double tp_sent = tp_ ? double(tp_->stats().bytes_sent - tp_at_last_log_.bytes_sent) / double(steps) : 0.0;
  group_->all_reduce(bytes.data(), int64_t(bytes.size()), "memory report").wait();
  if (tp_) tp_->all_reduce(bytes.data(), int64_t(bytes.size()), "memory report").wait();
  if (pipeline_) pipeline_->group().all_reduce(bytes.data(), int64_t(bytes.size()), "memory report").wait();
  comm_at_last_log_ = dp_->comm_stats();
  if (tp_) tp_at_last_log_ = tp_->stats();
  steps_since_log_ = 0;
  nlohmann::json params = nlohmann::json::array(), grads = nlohmann::json::array(), opt = nlohmann::json::array();
  for (int r = 0; r < ranks; ++r) {
    params.push_back(int64_t(bytes[size_t(3 * r)]));
    grads.push_back(int64_t(bytes[size_t(3 * r + 1)]));
    opt.push_back(int64_t(bytes[size_t(3 * r + 2)]));
  }
  nlohmann::json j = {{"world_size", ranks},
                      {"tensor_parallel_size", tp},
                      {"comm_tp_bytes_sent_per_step", int64_t(tp_sent)},
                      {"zero_stage", dp_->zero_stage()},
                      {"memory_parameters_bytes", params},
                      {"memory_gradients_bytes", grads},
                      {"memory_optimizer_state_bytes", opt},
                      {"memory_frozen_parameters_bytes", model_->frozen().bytes() + model_->frozen_bf16().bytes()},
                      {"comm_bytes_sent_per_step", int64_t(sent)},
                      {"comm_hidden_fraction", busy > 0 ? std::clamp(1.0 - blocked / busy, 0.0, 1.0) : 1.0}};
  if (pipeline_) j.update(pipeline_metrics());
  return j;
}

// Each stage's idle fraction (1 - time in forward and backward / the steps' span) and the bytes
// of activations and gradients it sent per step, since the last log.
nlohmann::json Trainer::pipeline_metrics() {
  const PipelineStats mine = pipeline_->take_stats();
  const int stages = pipeline_->num_stages(), stage = pipeline_->stage();
  std::vector<double> values(size_t(2 * stages), 0.0);
  values[size_t(stage)] = mine.span_seconds > 0 ? 1.0 - mine.busy_seconds / mine.span_seconds : 0.0;
  values[size_t(stages + stage)] = double(mine.bytes_sent) / double(std::max<int64_t>(1, mine.steps));
  pipeline_->group().all_reduce(values.data(), int64_t(values.size()), "pipeline report").wait();
  nlohmann::json idle = nlohmann::json::array(), sent = nlohmann::json::array();
  for (int s = 0; s < stages; ++s) {
    idle.push_back(values[size_t(s)]);
    sent.push_back(int64_t(values[size_t(stages + s)]));
  }
  return {{"pipeline_parallel_size", stages},
          {"pipeline_bubble_fraction", idle},
          {"pipeline_bytes_sent_per_step", sent}};
}

// On a terminal: one line redrawn every step with a bar, loss, lr, tokens/s, MFU and ETA.
void Trainer::show_progress(int64_t step, double loss, double lr, double tokens_per_s, double elapsed) {
  if (!::isatty(STDOUT_FILENO)) return;
  const Progress p{step, total_steps_, first_step_, loss, lr, tokens_per_s, mfu(tokens_per_s), elapsed};
  std::printf("\r%s ", progress_line(p).c_str());
  std::fflush(stdout);
}

void Trainer::log_step(const StepRecord& r, double eval_loss) {
  const nlohmann::json parallel = parallel_metrics();  // collective: every rank
  const nlohmann::json stage = stage_metrics(eval_loss);  // collective too
  if (!main_) return;
  nlohmann::json j = {{"step", r.step},          {"loss", r.loss},
                      {"lr", r.lr},              {"grad_norm", r.grad_norm},
                      {"tokens_per_s", r.tokens_per_s}, {"mfu", mfu(r.tokens_per_s)}, {"epoch", sampler_->epochs_done()},
                      {"skipped_steps", state_.skipped_steps()}};
  j.update(parallel);
  j.update(stage);
  const Device device = model_->options().device;
  if (!device.is_host()) j["device_peak_memory_bytes"] = backend(device.kind).allocator().total().peak;  // this rank's
  std::string eval_text;
  if (std::isfinite(eval_loss)) {
    j["eval_loss"] = eval_loss;
    eval_text = format("  eval_loss {}", eval_loss);
    if (!objective_) {  // a token-level loss
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
  trace::Scope traced(trace::kCheckpoint, "save checkpoint-" + std::to_string(step));
  last_save_ = std::chrono::steady_clock::now();
  state_.sampler = sampler_->state();
  const std::string dir = (fs::path(config_.output_dir) / ("checkpoint-" + std::to_string(step))).string();
  if (async_writer_)
    return async_writer_->save(dir, *dp_, state_, config_yaml_, tp_, config_.model_name_or_path, pipeline_.get(),
                               config_.save_total_limit, config_.save_only_model);
  save_checkpoint(dir, *dp_, state_, config_yaml_, tp_, config_.model_name_or_path, pipeline_.get(),
                  config_.save_only_model);
  if (grpo_) grpo_->save_checkpoint_part(dir, state_, config_yaml_);
  if (main_) prune_checkpoints(config_.output_dir, config_.save_total_limit);
  barrier_all("checkpoints pruned");
}

// A checkpoint saved by N ranks resumes on M: the sampler position counts this rank's share of
// the epoch's samples, so it scales by N / M.
void Trainer::resume(const std::string& checkpoint) {
  state_ = load_checkpoint(checkpoint, *dp_);
  FAB_USER_CHECK(state_.global_step <= total_steps_,
                 "resume_from_checkpoint: {} is at step {}, past this run's {} steps: there is nothing to train, and "
                 "its weights are not those of a {}-step run; set max_steps above {}, or resume from an earlier "
                 "checkpoint",
                 checkpoint, state_.global_step, total_steps_, total_steps_, state_.global_step);
  if (main_ && state_.global_step == total_steps_)
    std::printf("note: %s is at the run's last step %lld: nothing left to train; its weights become the final model\n",
                checkpoint.c_str(), (long long)total_steps_);
  if (grpo_) grpo_->load_checkpoint_part(checkpoint);
  const int64_t saved_world = state_.world_size;
  if (saved_world != group_->size()) {
    const int64_t consumed = state_.sampler.position * saved_world;
    state_.sampler.position = consumed / group_->size();
    if (main_ && consumed % group_->size() != 0)
      std::printf("note: the checkpoint was saved by %lld ranks; %lld samples of its epoch do not divide among %d\n",
                  (long long)saved_world, (long long)consumed, group_->size());
  }
  sampler_->restore(state_.sampler);
  if (main_) note_changed_settings(checkpoint, config_);
  if (main_) truncate_metrics(config_.output_dir, state_.global_step);
  barrier_all("resumed");
  if (main_) std::printf("resumed from %s at step %lld\n", checkpoint.c_str(), (long long)state_.global_step);
}

bool Trainer::run() {
  StopOnSignal signals;
  const LrSchedule schedule = make_schedule(config_, total_steps_, warmup_steps_);
  const std::string checkpoint = checkpoint_to_resume(config_);
  const bool resuming = !checkpoint.empty();
  if (objective_) {  // the reference is the starting weights: before a resume replaces them
    objective_->prepare(*model_, *group_);
    dp_->release_gathered_parameters();
  }
  if (grpo_) grpo_->prepare();  // likewise
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
      loss = train_step(step, lr, &grad_norm, &window_tokens);
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
  dp_->gather_all_parameters();
  if (pipeline_) {
    const std::vector<NamedTensor> weights = gather_stage_weights(*pipeline_, tp_, group_->rank() == 0);
    if (main_) save_model_folder(model_->config(), weights, config_.output_dir);
  } else if (tp_) {
    const std::vector<NamedTensor> whole = gather_full_tensors(*model_, *tp_);
    if (main_) save_model_folder(model_->config(), whole, config_.output_dir);
  } else if (main_) {
    save_trained_weights(*model_, config_.output_dir, config_.model_name_or_path);
  }
  dp_->release_gathered_parameters();
  if (grpo_) grpo_->save_final(config_.output_dir, main_);
  barrier_all("final model written");
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
