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

// Each host once, each name a host name or address (no spaces): a UserError naming `where` else.
void check_host_names(const std::vector<ClusterHost>& hosts, const std::string& where);
// Reads and checks a cluster file (a UserError naming the file and line for anything wrong).
ClusterFile load_cluster_file(const std::string& path);
void save_cluster_file(const std::string& path, const ClusterFile& cluster);

}  // namespace fab
