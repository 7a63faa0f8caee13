// fabrica init: writes the cluster file of a multi-node run.
#include <cstdio>
#include <sstream>

#include "cli/args.h"
#include "cli/commands.h"
#include "core/error.h"
#include "launch/cluster_file.h"

namespace fab {

int run_init(int argc, char** argv) {
  Args args(argc, argv, 2, {"hosts", "nproc-per-node", "iface", "rsh-agent", "output"}, {});
  FAB_USER_CHECK(args.has("hosts"), "usage: fabrica init --hosts h1,h2 --nproc-per-node N [--iface eth0] "
                                    "[--rsh-agent CMD] [--output cluster.yaml]");
  const double slots = args.get_number("nproc-per-node", 1);
  FAB_USER_CHECK(slots >= 1 && slots == int(slots), "--nproc-per-node must be a positive integer");
  ClusterFile cluster;
  std::stringstream hosts(args.get("hosts"));
  for (std::string host; std::getline(hosts, host, ',');)
    if (!host.empty()) cluster.hosts.push_back({host, int(slots)});
  FAB_USER_CHECK(!cluster.hosts.empty(), "--hosts: expected a comma-separated list of host names");
  check_host_names(cluster.hosts, "--hosts");
  cluster.iface = args.get("iface");
  cluster.rsh_agent = args.get("rsh-agent");
  const std::string output = args.get("output", "cluster.yaml");
  save_cluster_file(output, cluster);
  std::printf("wrote %s: %zu hosts, %d workers; train with: fabrica train CONFIG.yaml cluster=%s\n", output.c_str(),
              cluster.hosts.size(), cluster.total_slots(), output.c_str());
  return 0;
}

}  // namespace fab
