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

// Runs the command in its own process group, forwards SIGINT/SIGTERM/SIGHUP to it as SIGUSR1,
// and returns its exit status (128 + signal when it was killed). The command gets SIGTERM when
// this process dies, however it dies. When it fails, the collective timeouts that ranks other
// than 0 wrote to their logs in `log_dir` during the run are printed to stderr.
int run_launcher(const std::vector<std::string>& command, const std::string& log_dir);

// Worker side: stdout and stderr into output_dir/logs/rank-<rank>.log (rank 0: and the console).
void start_rank_log(const std::string& output_dir, int rank);

}  // namespace fab
