#pragma once
// min_nodes with a cluster file: before each launch (the first and every restart) the launcher
// asks each host to run `true` through the cluster's rsh agent (ssh when it names none), as
// mpirun would reach it. A host that does not answer within the probe's timeout, on every try,
// is left out when at least min_nodes hosts remain; the job then runs on the others' slots
// (a checkpoint saved by more ranks resumes resharded over data parallelism) and says so.
// Fewer than min_nodes reachable hosts is a UserError naming the unreachable ones.
#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "launch/cluster_file.h"

namespace fab {

// Runs `agent host true` (agent split at spaces; ssh in batch mode when empty) and reports
// whether it exited 0 within `timeout` (a probe still running then is killed).
bool host_answers(const std::string& rsh_agent, const std::string& host, std::chrono::milliseconds timeout);

struct HostSelection {
  ClusterFile cluster;                 // the hosts that answered
  std::vector<std::string> left_out;  // the hosts that did not, in the file's order
};

// The hosts of `cluster` that answer `probe` in one of `tries` rounds (`pause` apart, asking
// again only those that have not answered). Needs at least `min_nodes` of them.
HostSelection select_hosts(const ClusterFile& cluster, int64_t min_nodes, int tries, std::chrono::milliseconds pause,
                           const std::function<bool(const std::string& host)>& probe);

}  // namespace fab
