#pragma once
// Automatic restart (max_restarts): the launcher runs the workers, and when the job fails — a
// worker died, hung past ddp_timeout, or a collective timed out — it waits restart_backoff_s and
// starts every worker again from the newest complete checkpoint of output_dir (from the start
// when there is none yet), up to max_restarts times. Exact resume makes the losses after a restart
// those of a run that never failed. Each failure and restart is printed and appended to
// output_dir/events.jsonl (time, cause, rank, exit code, the step resumed from).
// Not restarted: a run that finished, one stopped by a signal sent to the launcher (the user's
// Ctrl-C, scancel), and a user error (exit code 2: the config, the data or a non-finite loss,
// which a restart would only repeat).
#include <functional>
#include <string>
#include <vector>

#include "config/train_config.h"
#include "launch/launcher.h"

namespace fab {

// `command(extra)`: the mpirun command line whose workers get the key=value overrides `extra`
// after their own. Returns the exit code of the last run.
int run_with_restarts(const TrainConfig& config, const std::function<std::vector<std::string>(
                                                      const std::vector<std::string>& extra)>& command);

// Whether a run that ended so is started again (with restarts left).
bool worth_restarting(const LaunchResult& result);

}  // namespace fab
