#include "launch/restart.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <thread>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/file_write.h"
#include "core/stop_signals.h"
#include "io/checkpoint_names.h"
#include "launch/host_probe.h"

namespace fab {
namespace fs = std::filesystem;
namespace {

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&now, &tm);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return text;
}

void record(const std::string& output_dir, nlohmann::json event) {
  event["time"] = utc_now();
  AppendFile((fs::path(output_dir) / "events.jsonl").string(), true).append_line(event.dump());
}

// Waits `seconds`; false when a stop signal (Ctrl-C, scancel) came meanwhile.
bool wait_unless_stopped(double seconds) {
  std::atomic<bool> stopped{false};
  StopSignalHandler stop([&stopped](int) { stopped = true; });
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!stopped && std::chrono::steady_clock::now() < end) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  return !stopped;
}

// min_nodes: the hosts that answer now (all of them without min_nodes); those left out are
// printed and recorded.
ClusterFile hosts_for_this_launch(const TrainConfig& c, const ClusterFile& cluster) {
  if (c.min_nodes <= 0 || cluster.hosts.empty()) return cluster;
  const auto probe = [&](const std::string& host) {
    return host_answers(cluster.rsh_agent, host, std::chrono::seconds(10));
  };
  const HostSelection s = select_hosts(cluster, c.min_nodes, 3, std::chrono::seconds(2), probe);
  if (s.left_out.empty()) return s.cluster;
  std::string names;
  for (const std::string& n : s.left_out) names += (names.empty() ? "" : ", ") + n;
  std::fprintf(stderr, "fabrica: %s did not answer (3 tries): left out; %d workers on %zu of %zu hosts (min_nodes %lld)\n",
               names.c_str(), s.cluster.total_slots(), s.cluster.hosts.size(), cluster.hosts.size(),
               (long long)c.min_nodes);
  record(c.output_dir, {{"event", "hosts_left_out"},
                        {"hosts", s.left_out},
                        {"ranks", s.cluster.total_slots()},
                        {"ranks_in_cluster_file", cluster.total_slots()},
                        {"min_nodes", c.min_nodes}});
  return s.cluster;
}

}  // namespace

bool worth_restarting(const LaunchResult& r) { return r.exit_code != 0 && r.exit_code != 2 && !r.stop_requested; }

int run_with_restarts(const TrainConfig& c, const ClusterFile& cluster, const LaunchCommand& command) {
  const std::string log_dir = (fs::path(c.output_dir) / "logs").string();
  std::vector<std::string> extra;
  for (int64_t attempt = 0;; ++attempt) {
    const LaunchResult result = run_launcher(command(extra, hosts_for_this_launch(c, cluster)), log_dir);
    if (!worth_restarting(result)) return result.exit_code;
    nlohmann::json failure = {{"event", "failure"}, {"cause", result.cause}, {"exit_code", result.exit_code}};
    if (result.failed_rank >= 0) failure["rank"] = result.failed_rank;
    record(c.output_dir, failure);
    if (attempt == c.max_restarts) {
      if (c.max_restarts > 0) {
        std::fprintf(stderr, "fabrica: the job failed (%s) after %lld restarts (max_restarts): giving up\n",
                     result.cause.c_str(), (long long)c.max_restarts);
        record(c.output_dir, {{"event", "gave_up"}, {"restarts", c.max_restarts}});
      }
      return result.exit_code;
    }
    const std::string checkpoint = latest_checkpoint(c.output_dir);
    const int64_t step = checkpoint.empty() ? 0 : checkpoint_step(checkpoint);
    // The workers' own resume_from_checkpoint / overwrite_output_dir come first; these win.
    extra = checkpoint.empty() ? std::vector<std::string>{"resume_from_checkpoint=false", "overwrite_output_dir=true"}
                               : std::vector<std::string>{"resume_from_checkpoint=" + checkpoint};
    std::fprintf(stderr, "fabrica: the job failed (%s); restart %lld of %lld in %.0f s, from %s\n",
                 result.cause.c_str(), (long long)(attempt + 1), (long long)c.max_restarts, c.restart_backoff_s,
                 checkpoint.empty() ? "the start (no checkpoint yet)" : (checkpoint + ", step " + std::to_string(step)).c_str());
    record(c.output_dir, {{"event", "restart"},
                          {"restart", attempt + 1},
                          {"max_restarts", c.max_restarts},
                          {"checkpoint", checkpoint},
                          {"resumed_from_step", step}});
    if (!wait_unless_stopped(c.restart_backoff_s)) {
      std::fprintf(stderr, "fabrica: stopped by a signal before the restart\n");
      return result.exit_code;
    }
  }
}

}  // namespace fab
