#include "plan/auto_layout.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "config/yaml_file.h"
#include "core/allocator.h"
#include "core/backend.h"
#include "core/error.h"
#include "core/pages.h"
#include "io/checkpoint_names.h"
#include "models/decoder.h"
#include "models/model_config.h"
#include "monitor/metrics_log.h"
#include "tokenizer/tokenizer.h"

namespace fab {
namespace {

namespace fs = std::filesystem;

// What loading the run's tokenizer adds to a process's peak resident memory (measured here, by
// loading it; a worker loads the same one before it builds the model).
double tokenizer_bytes(const std::string& model_dir) {
  const double before = process_peak_resident_bytes();
  try {
    const Tokenizer tokenizer = Tokenizer::load(model_dir);
  } catch (const UserError&) {
    return 0;  // no tokenizer there: training says so itself
  }
  return process_peak_resident_bytes() - before;
}

std::string bytes_text(double bytes) {
  return bytes >= 1e9 ? format("{} GB", std::round(bytes / 1e8) / 10) : format("{} MB", std::round(bytes / 1e5) / 10);
}

std::string percent_text(double predicted, double measured) {
  if (measured <= 0) return "n/a";
  const double error = 100 * (predicted - measured) / measured;
  return format("{}{}%", error >= 0 ? "+" : "", std::round(error * 10) / 10);
}

}  // namespace

void keep_checkpoint_layout(const std::string& checkpoint, PlanConstraints& fixed) {
  const fs::path saved = fs::path(checkpoint) / "train_config.yaml";
  if (!fs::exists(saved)) return;
  const YAML::Node y = load_yaml_file(saved.string(), "the train_config.yaml its run saved");
  auto number = [&](const char* key, int64_t fallback) {
    try {
      return y[key] ? y[key].as<int64_t>() : fallback;
    } catch (const YAML::Exception&) {
      throw UserError(format("{}: {}: expected an integer, got \"{}\"", saved.string(), key, YAML::Dump(y[key])));
    }
  };
  auto flag = [&](const char* key) {
    const std::optional<bool> value = y[key] && y[key].IsScalar() ? parse_bool(y[key].Scalar()) : std::optional<bool>();
    FAB_USER_CHECK(!y[key] || value, "{}: {}: expected true or false, got \"{}\"", saved.string(), key,
                   YAML::Dump(y[key]));
    return value.value_or(false);
  };
  fixed.tp = int(number("tensor_parallel_size", 1));
  fixed.cp = int(number("context_parallel_size", 1));
  fixed.pp = int(number("pipeline_parallel_size", 1));
  fixed.vpp = int(number("virtual_pipeline_parallel_size", 1));
  fixed.zero_stage = int(number("zero_stage", 0));
  fixed.ep = int(number("expert_parallel_size", 1));
  fixed.recompute = flag("recompute_layers");
  fixed.sequence_parallel = flag("sequence_parallel");
  fixed.micro_batch_size = number("per_device_train_batch_size", 1);
  fixed.keys = {"the layout of " + checkpoint};
}

namespace {

std::string layout_text(const nlohmann::json& l) {
  const int ep = l.value("expert_parallel_size", 1);
  return format("tp {} x cp {} x pp {}{} x dp {}{}{}, zero_stage {}, recompute {}, micro-batch {} x {} accumulation steps",
                l["tensor_parallel_size"].get<int>(), l["context_parallel_size"].get<int>(),
                l["pipeline_parallel_size"].get<int>(),
                l["virtual_pipeline_parallel_size"].get<int>() > 1
                    ? format(" (vpp {})", l["virtual_pipeline_parallel_size"].get<int>())
                    : std::string(),
                l["data_parallel_size"].get<int>(), l["sequence_parallel"].get<bool>() ? " (sequence parallel)" : "",
                ep > 1 ? format(", expert parallel {}", ep) : std::string(),
                l["zero_stage"].get<int>(), l["recompute"].get<bool>() ? "on" : "off",
                l["micro_batch_size"].get<int64_t>(), l["gradient_accumulation_steps"].get<int64_t>());
}

}  // namespace

double warm_worker_resident_bytes() {
  {
    const ModelConfig config = parse_model_config(
        R"({"model_type": "qwen3", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
            "max_position_embeddings": 64, "tie_word_embeddings": false})",
        "the warm-up model");
    DecoderModel model(config);
    model.init_random(1);
    Tensor ids = Tensor::empty({2, 64}, DType::i64, MemoryCategory::activations);
    for (int64_t i = 0; i < ids.numel(); ++i) ids.data<int64_t>()[i] = (i * 7) % 256;
    model.forward_backward(ids, ids, 1.0f);
  }
  if (auto* host = dynamic_cast<HostAllocator*>(&backend(DeviceKind::cpu).allocator())) host->release_cached();
  return process_resident_bytes();
}

namespace {

AutoPlan plan_on_rank_zero(const TrainConfig& config, int world_size) {
  ClusterSpec cluster = cluster_for_run(config, world_size);
  // This process is a worker: what it holds now is a worker's runtime (MPI, oneDNN, the binary).
  if (cluster.device.host && config.plan_cluster.empty()) cluster.device.reserved_bytes = warm_worker_resident_bytes();
  const PlanProblem problem = problem_for_run(config, world_size, cluster);
  PlanConstraints fixed = plan_constraints(config);
  const std::string checkpoint = checkpoint_to_resume(config.resume_from_checkpoint, config.output_dir);
  if (!checkpoint.empty()) keep_checkpoint_layout(checkpoint, fixed);
  const Plan plan = make_plan(problem, cluster, fixed);
  const PlannedLayout* chosen = first_runnable(plan);
  FAB_USER_CHECK(chosen, "parallel: auto: {}", no_layout_reason(plan, cluster.devices()));
  const nlohmann::json layout = layout_json(*chosen);
  std::string constrained;
  for (const std::string& k : plan.constrained_by) constrained += (constrained.empty() ? "" : ", ") + k;
  std::printf("parallel: auto: %lld layouts of %d ranks (%s) evaluated in %.3f s%s\n", (long long)plan.evaluated,
              world_size, cluster.device.name.c_str(), plan.seconds,
              constrained.empty() ? "" : ("; kept as set: " + constrained).c_str());
  std::printf("parallel: auto chose %s (global batch %lld)\n", layout_text(layout).c_str(),
              (long long)problem.global_batch);
  std::printf("parallel: auto predicts %s per rank at peak, %.3f s per step; %s\n",
              bytes_text(chosen->memory.total()).c_str(), chosen->time.step,
              memory_breakdown_text(chosen->memory).c_str());
  std::fflush(stdout);
  return {{"layout", layout},
          {"cluster", cluster.device.name},
          {"constrained_by", plan.constrained_by},
          {"global_batch", problem.global_batch}};
}

// Rank 0's `text` on every rank.
std::string broadcast_text(Communicator& world, std::string text) {
  int64_t length = int64_t(text.size());
  world.broadcast(&length, sizeof length, 0, "parallel: auto plan size").wait();
  text.resize(size_t(length));
  world.broadcast(text.data(), length, 0, "parallel: auto plan").wait();
  return text;
}

}  // namespace

ClusterSpec cluster_for_run(const TrainConfig& config, int world_size) {
  if (config.plan_cluster.empty()) return this_machine(world_size);
  const ClusterSpec c = load_cluster_spec(config.plan_cluster);
  FAB_USER_CHECK(c.devices() == world_size,
                 "plan_cluster {}: {} node(s) x {} devices = {}, but the run has {} ranks (calibrate with `fabrica "
                 "plan --calibrate --nproc {}`)",
                 config.plan_cluster, c.nodes, c.devices_per_node, c.devices(), world_size, world_size);
  return c;
}

PlanProblem problem_for_run(const TrainConfig& config, int world_size, const ClusterSpec& cluster) {
  FAB_USER_CHECK(!config.model_name_or_path.empty(), "model_name_or_path is required");
  const ModelConfig model = load_model_config((fs::path(config.model_name_or_path) / "config.json").string());
  PlanProblem problem = problem_from_config(config, model, world_size);
  if (cluster.device.host) problem.host_bytes = tokenizer_bytes(config.model_name_or_path);
  return problem;
}

void apply_planned_layout(const nlohmann::json& l, TrainConfig& c) {
  c.tensor_parallel_size = l["tensor_parallel_size"].get<int64_t>();
  c.context_parallel_size = l["context_parallel_size"].get<int64_t>();
  c.pipeline_parallel_size = l["pipeline_parallel_size"].get<int64_t>();
  c.virtual_pipeline_parallel_size = l["virtual_pipeline_parallel_size"].get<int64_t>();
  c.pipeline_schedule = c.virtual_pipeline_parallel_size > 1 ? "interleaved_1f1b" : "1f1b";
  if (c.pipeline_parallel_size > 1) c.pipeline_layers = l["pipeline_layers"].get<std::vector<int64_t>>();
  c.sequence_parallel = l["sequence_parallel"].get<bool>();
  c.zero_stage = l["zero_stage"].get<int64_t>();
  c.expert_parallel_size = l.value("expert_parallel_size", int64_t(1));
  c.recompute_layers = l["recompute"].get<bool>();
  c.per_device_train_batch_size = l["micro_batch_size"].get<int64_t>();
  c.gradient_accumulation_steps = l["gradient_accumulation_steps"].get<int64_t>();
}

std::optional<AutoPlan> plan_parallel_auto(TrainConfig& config, Communicator& world) {
  if (config.parallel != "auto") return std::nullopt;
  std::string text;
  if (world.rank() == 0) {
    try {
      text = plan_on_rank_zero(config, world.size()).dump();
    } catch (const UserError& e) {
      text = nlohmann::json{{"error", e.what()}}.dump();
    }
  }
  const AutoPlan plan = nlohmann::json::parse(broadcast_text(world, text));
  if (plan.contains("error"))
    throw UserError(world.rank() == 0 ? plan["error"].get<std::string>() : "parallel: auto: rank 0 found no layout to run");
  apply_planned_layout(plan["layout"], config);
  return plan;
}

void report_parallel_auto(const AutoPlan& plan, int64_t step, double measured_step_seconds, Communicator& world,
                          const std::string& output_dir) {
  std::vector<double> peaks(size_t(world.size()), 0.0);
  peaks[size_t(world.rank())] = process_peak_resident_bytes();
  world.all_reduce(peaks.data(), int64_t(peaks.size()), "parallel: auto report").wait();
  if (world.rank() != 0) return;
  const nlohmann::json& layout = plan["layout"];
  const double predicted_memory = layout["memory_bytes"].get<double>();
  const double predicted_step = layout["step_seconds"].get<double>();
  const size_t busiest = size_t(std::max_element(peaks.begin(), peaks.end()) - peaks.begin());
  std::printf("parallel: auto: peak memory per rank predicted %s, measured %s (rank %zu, the largest; %s); step time "
              "predicted %.3f s, measured %.3f s (%s)\n",
              bytes_text(predicted_memory).c_str(), bytes_text(peaks[busiest]).c_str(), busiest,
              percent_text(predicted_memory, peaks[busiest]).c_str(), predicted_step, measured_step_seconds,
              percent_text(predicted_step, measured_step_seconds).c_str());
  nlohmann::json per_rank = nlohmann::json::array();
  for (double p : peaks) per_rank.push_back(int64_t(p));
  const nlohmann::json line = {{"step", step},
                               {"predicted_memory_bytes", int64_t(predicted_memory)},
                               {"predicted_step_seconds", predicted_step},
                               {"peak_memory_bytes", int64_t(peaks[busiest])},
                               {"peak_memory_bytes_per_rank", per_rank},
                               {"step_seconds", measured_step_seconds},
                               {"parallel_layout", layout}};
  MetricsLog(output_dir, true).write(line.dump());
  std::fflush(stdout);
}

}  // namespace fab
