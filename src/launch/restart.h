#pragma once
// Automatic restart (max_restarts): the launcher runs the workers, and when the job fails — a
// worker died, hung past ddp_timeout, or a collective timed out — it waits restart_backoff_s and
// starts every worker again from the newest complete checkpoint of output_dir (from the start
// when there is none yet), up to max_restarts times. Exact resume makes the losses after a restart
// those of a run that never failed. Each failure and restart is printed and appended to
// output_dir/events.jsonl (time, cause, rank, exit code, the step resumed from). With min_nodes
// and a cluster file, each launch first leaves out the hosts that do not answer
// (launch/host_probe.h), recording them ("hosts_left_out": the hosts, the ranks now and before).
// Not restarted: a run that finished, one stopped by a signal sent to the launcher (the user's
// Ctrl-C, scancel), and a user error (exit code 2: the config, the data or a non-finite loss,
// which a restart would only repeat).
#include <functional>
#include <string>
#include <vector>

#include "config/train_config.h"
#include "launch/launcher.h"

namespace fab {

// `command(extra, cluster)`: the mpirun command line, on `cluster`'s hosts (those that answered),
// whose workers get the key=value overrides `extra` after their own. Returns the exit code of the
// last run.
using LaunchCommand =
    std::function<std::vector<std::string>(const std::vector<std::string>& extra, const ClusterFile& cluster)>;
int run_with_restarts(const TrainConfig& config, const ClusterFile& cluster, const LaunchCommand& command);

// Whether a run that ended so is started again (with restarts left).
bool worth_restarting(const LaunchResult& result);

}  // namespace fab
