// fabrica plan RUN.yaml [key=value ...] [--cluster FILE | --devices N --devices-per-node M --device NAME]
//              [--top N] [--json]
// fabrica plan --calibrate [--nproc N] [--output FILE]
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/args.h"
#include "cli/commands.h"
#include "comm/world.h"
#include "config/train_config.h"
#include "core/error.h"
#include "core/pages.h"
#include "launch/cluster_file.h"
#include "launch/launcher.h"
#include "plan/auto_layout.h"
#include "plan/planner.h"

namespace fab {
namespace {

namespace fs = std::filesystem;

// Seconds per call of `fn`, the best of `rounds` rounds of `reps` calls.
template <typename Fn>
double best_seconds(int rounds, int reps, Fn fn) {
  double best = 1e30;
  for (int r = 0; r < rounds; ++r) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) fn();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / reps);
  }
  return best;
}

// Under mpirun: the ring all-reduce's latency (a 1 KB buffer: 2 (n-1) messages) and bus bandwidth
// (64 MB: 2 (n-1)/n of it sent), and a worker's resident bytes before any model; rank 0 prints
// one JSON line.
int calibrate_communication() {
  WorldInfo info = world_from_environment();
  std::unique_ptr<Communicator> world = join_world(info, 600);
  measure_gemm_flops(false, 0.05);  // oneDNN's code and JIT kernels resident, as in a worker
  const double rss = warm_worker_resident_bytes();
  const int n = world->size();
  std::vector<float> small(256, 1.0f), large(size_t(16) << 20, 1.0f);
  world->barrier("calibrate");
  const double t_small = best_seconds(3, 50, [&] { world->all_reduce(small.data(), int64_t(small.size()), "calibrate").wait(); });
  const double t_large = best_seconds(3, 3, [&] { world->all_reduce(large.data(), int64_t(large.size()), "calibrate").wait(); });
  if (world->rank() == 0) {
    const double bytes = double(large.size() * sizeof(float));
    const nlohmann::json j = {{"ranks", n},
                              {"latency", n > 1 ? t_small / (2.0 * (n - 1)) : 0.0},
                              {"bandwidth", n > 1 ? 2.0 * (n - 1) / n * bytes / t_large : 0.0},
                              {"resident_bytes", rss}};
    std::printf("%s\n", j.dump().c_str());
  }
  world.reset();
  leave_world();
  return 0;
}

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char ch : s) out += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return out + "'";
}

nlohmann::json run_communication_probe(int processes) {
  TrainConfig launch;
  launch.nproc_per_node = processes;
  const std::vector<std::string> worker = {fs::read_symlink("/proc/self/exe").string(), "plan", "--calibrate-comm"};
  std::string command;
  for (const std::string& word : mpirun_command(launch, ClusterFile{}, worker)) command += shell_quote(word) + " ";
  FILE* pipe = ::popen((command + "2>&1").c_str(), "r");
  FAB_USER_CHECK(pipe, "cannot start mpirun for the communication probe");
  std::string output, line;
  char buffer[4096];
  while (std::fgets(buffer, sizeof buffer, pipe)) output += buffer;
  const int status = ::pclose(pipe);
  FAB_USER_CHECK(status == 0, "the communication probe ({}) failed:\n{}", command, output);
  const size_t brace = output.rfind('{');
  FAB_USER_CHECK(brace != std::string::npos, "the communication probe printed no result:\n{}", output);
  return nlohmann::json::parse(output.substr(brace));
}

int calibrate(const Args& args) {
  const int processes = int(args.get_integer("nproc", 2, 1, 1024));
  ClusterSpec c = this_machine(processes);
  const double fp32 = measure_gemm_flops(false, 1.0), bf16 = measure_gemm_flops(true, 1.0);
  c.device.gemm_efficiency = std::min(1.0, fp32 / processes / c.device.peak_flops_fp32);
  c.device.peak_flops_bf16 = std::max(c.device.peak_flops_fp32, bf16 / processes / c.device.gemm_efficiency);
  if (processes > 1) {
    const nlohmann::json probe = run_communication_probe(processes);
    c.intra_node = c.inter_node = {probe["bandwidth"].get<double>(), probe["latency"].get<double>()};
    c.device.reserved_bytes = probe["resident_bytes"].get<double>();
  }
  const std::string yaml = cluster_spec_to_yaml(c);
  std::printf("GEMM 512^3: fp32 %.1f GFLOP/s, bf16 %.1f GFLOP/s (whole machine); %d processes share it\n",
              fp32 / 1e9, bf16 / 1e9, processes);
  if (args.has("output")) {
    std::ofstream out(args.get("output"));
    FAB_USER_CHECK(out && (out << yaml), "--output {}: cannot write", args.get("output"));
    std::printf("wrote %s\n", args.get("output").c_str());
  }
  std::fputs(yaml.c_str(), stdout);
  return 0;
}

ClusterSpec cluster_of(const Args& args, const TrainConfig& config) {
  const bool hypothetical = args.has("devices") || args.has("devices-per-node") || args.has("device");
  FAB_USER_CHECK(!(hypothetical && args.has("cluster")), "give either --cluster or --devices/--device, not both");
  if (args.has("cluster")) return load_cluster_spec(args.get("cluster"));
  if (!hypothetical) return cluster_for_run(config, int(config.nproc_per_node));
  FAB_USER_CHECK(args.has("devices") && args.has("device"),
                 "a hypothetical cluster needs --devices N and --device h100-80g|h200-141g|a100-80g|910b-64g "
                 "(--devices-per-node defaults to 8)");
  const int devices = int(args.get_integer("devices", 1, 1, 1 << 20));
  const int per_node = int(args.get_integer("devices-per-node", std::min(devices, 8), 1, 1 << 20));
  return preset_cluster(args.get("device"), devices, per_node);
}

}  // namespace

int run_plan(int argc, char** argv) {
  const Args args(argc, argv, 2, {"cluster", "top", "devices", "devices-per-node", "device", "nproc", "output"},
                  {"json", "calibrate", "calibrate-comm"});
  if (args.flag("calibrate-comm")) return calibrate_communication();
  if (args.flag("calibrate")) return calibrate(args);
  FAB_USER_CHECK(!args.positional().empty(), "usage: fabrica plan RUN.yaml [key=value ...] [--cluster FILE] [--top N] [--json]");
  const std::vector<std::string> overrides(args.positional().begin() + 1, args.positional().end());
  const TrainConfig config = load_train_config(args.positional()[0], overrides);
  FAB_USER_CHECK(!config.model_name_or_path.empty(), "{}: model_name_or_path is required", args.positional()[0]);
  const ClusterSpec cluster = cluster_of(args, config);
  const PlanProblem problem = problem_for_run(config, int(config.nproc_per_node), cluster);
  const int top = int(args.get_integer("top", 5, 1, 1 << 20));
  const Plan plan = make_plan(problem, cluster, plan_constraints(config));
  if (args.flag("json"))
    std::printf("%s\n", plan_json(plan, top).dump(1).c_str());
  else
    std::fputs(plan_table(plan, problem, cluster, top).c_str(), stdout);
  return plan.layouts.empty() ? 3 : 0;
}

}  // namespace fab
