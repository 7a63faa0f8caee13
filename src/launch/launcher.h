#pragma once
// Starting the workers of a distributed run. `fabrica train` run by hand with nproc_per_node > 1
// or a cluster file re-executes itself as the workers under mpirun (handling root and
// oversubscription), in a process group of its own: Ctrl-C reaches only this launcher, which
// forwards SIGUSR1 through mpirun so every worker saves a checkpoint and stops together; killing
// the launcher (even with SIGKILL) ends mpirun and the workers. A worker
// (started by mpirun or srun) sends its output to output_dir/logs/rank-<N>.log; rank 0 also
// keeps printing to the console.
#include <string>
#include <vector>

#include "config/train_config.h"
#include "launch/cluster_file.h"

namespace fab {

// The mpirun command line that runs `worker_args` (the fabrica executable and its arguments) as
// nproc_per_node workers here, or as every slot of `cluster` when it has hosts.
std::vector<std::string> mpirun_command(const TrainConfig& config, const ClusterFile& cluster,
                                        const std::vector<std::string>& worker_args);

// The workers a launch starts: nproc_per_node here, or every slot of `cluster` when it has hosts.
// Refused at once (a UserError with the numbers): more than kMaxWorkersPerCore workers per core of
// this machine (`cores`), which only wait on each other and starve the collectives into timeouts
// or hangs, and a nproc_per_node past a cluster host's slots (a cluster run starts one worker per
// slot).
constexpr int kMaxWorkersPerCore = 8;
int checked_worker_count(const TrainConfig& config, const ClusterFile& cluster, int cores);
// The cores this process may run on (its CPU affinity; the machine's when that is unknown).
int usable_cores();

// How one run of the workers ended.
struct LaunchResult {
  int exit_code = 0;            // mpirun's (128 + signal when it was killed)
  bool stop_requested = false;  // this process got SIGINT/SIGTERM/SIGHUP and passed it on
  std::string cause;            // for a failure: what went wrong, from mpirun's report or the rank logs
  int failed_rank = -1;         // the rank that died, hung or timed out, when one is named
};

// Runs the command in its own process group, forwards SIGINT/SIGTERM/SIGHUP to it as SIGUSR1,
// and returns how it ended. The command gets SIGTERM when this process dies, however it dies.
// Its stderr passes through to ours. When it fails, the collective timeouts that ranks other
// than 0 wrote to their logs in `log_dir` during the run are printed to stderr.
LaunchResult run_launcher(const std::vector<std::string>& command, const std::string& log_dir);

// The failure named in mpirun's stderr and the ranks' timeout lines: "rank 1 exited on signal 9
// (Killed)", or a rank's "collective ... did not finish within ..." line with the rank it names.
// Exposed for tests.
void explain_failure(const std::string& mpirun_stderr, const std::vector<std::string>& timeout_lines,
                     LaunchResult& result);

// Worker side: stdout and stderr into output_dir/logs/rank-<rank>.log (rank 0: and the console).
void start_rank_log(const std::string& output_dir, int rank);

}  // namespace fab
