#pragma once
// The cluster file `fabrica init` writes and `cluster: FILE` reads: the hosts of a multi-node run,
// worker slots on each, and the network the workers talk over.
//
//   hosts:
//     - {name: node1, slots: 8}
//     - {name: node2, slots: 8}
//   iface: eth0            # an interface name or a CIDR such as 10.0.0.0/24
//   rsh_agent: ssh         # how mpirun starts its daemon on the other hosts (optional)
#include <string>
#include <vector>

namespace fab {

struct ClusterHost {
  std::string name;
  int slots = 1;
};

struct ClusterFile {
  std::vector<ClusterHost> hosts;
  std::string iface;
  std::string rsh_agent;
  int total_slots() const;
};

ClusterFile load_cluster_file(const std::string& path);
void save_cluster_file(const std::string& path, const ClusterFile& cluster);

}  // namespace fab
