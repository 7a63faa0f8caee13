// The cluster file round trip and its errors, and the mpirun command lines the launcher builds.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "launch/launcher.h"
#include "test_util.h"

namespace fab {
namespace {

std::string text_of(const std::vector<std::string>& words) {
  std::string s;
  for (const std::string& w : words) s += (s.empty() ? "" : " ") + w;
  return s;
}

TEST(Launcher, ClusterFileRoundTrips) {
  const std::string path = test::scratch_path("cluster.yaml");
  save_cluster_file(path, {{{"node1", 8}, {"node2", 4}}, "10.0.0.0/24", "ssh -p 2222"});
  const ClusterFile c = load_cluster_file(path);
  ASSERT_EQ(c.hosts.size(), 2u);
  EXPECT_EQ(c.hosts[1].name, "node2");
  EXPECT_EQ(c.hosts[1].slots, 4);
  EXPECT_EQ(c.total_slots(), 12);
  EXPECT_EQ(c.iface, "10.0.0.0/24");
  EXPECT_EQ(c.rsh_agent, "ssh -p 2222");
}

TEST(Launcher, BadClusterFilesNameTheFile) {
  const std::string path = test::scratch_path("bad-cluster.yaml");
  auto error_of = [&](const std::string& text) {
    std::ofstream(path) << text;
    try {
      load_cluster_file(path);
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(error_of("iface: eth0\n").find(path + ": expected `hosts:`"), std::string::npos);
  EXPECT_NE(error_of("hosts:\n  - {name: a, slots: 0}\n").find("slots > 0"), std::string::npos);
  EXPECT_NE(error_of("hosts: [\n").find("not valid YAML"), std::string::npos);
  EXPECT_NE(error_of("").find(path), std::string::npos);
  // A host twice, or a name no host can have, was accepted (and mpirun failed or doubled the slots).
  EXPECT_NE(error_of("hosts:\n  - {name: a, slots: 2}\n  - {name: b}\n  - {name: a}\n")
                .find(path + ": host a is listed twice"),
            std::string::npos);
  EXPECT_NE(error_of("hosts:\n  - {name: node 1, slots: 2}\n").find(path + ": host \"node 1\" is not a host name"),
            std::string::npos);
  EXPECT_EQ(error_of("hosts:\n  - {name: node-1.example.com}\n  - {name: 10.0.0.2}\n  - {name: fe80::1}\n"),
            "accepted");
  try {
    load_cluster_file(test::scratch_path("missing.yaml"));
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot open"), std::string::npos);
  }
}

TEST(Launcher, MpirunCommandForOneMachine) {
  TrainConfig c;
  c.nproc_per_node = 64;  // more than this machine's cores
  const std::string cmd = text_of(mpirun_command(c, {}, {"/bin/fabrica", "train", "run.yaml"}));
  EXPECT_NE(cmd.find("-np 64"), std::string::npos) << cmd;
  EXPECT_NE(cmd.find("--oversubscribe"), std::string::npos) << cmd;
  EXPECT_EQ(cmd.find("--allow-run-as-root") != std::string::npos, ::geteuid() == 0) << cmd;
  EXPECT_EQ(cmd.substr(cmd.size() - 27), "/bin/fabrica train run.yaml");
}

TEST(Launcher, MpirunCommandForACluster) {
  const ClusterFile cluster{{{"a", 2}, {"b", 3}}, "10.1.0.0/16", "/opt/agent"};
  const std::string cmd = text_of(mpirun_command(TrainConfig{}, cluster, {"fabrica", "train", "x.yaml"}));
  EXPECT_NE(cmd.find("-H a:2,b:3"), std::string::npos) << cmd;
  EXPECT_NE(cmd.find("-np 5"), std::string::npos) << cmd;
  EXPECT_NE(cmd.find("--mca btl_tcp_if_include 10.1.0.0/16 --mca oob_tcp_if_include 10.1.0.0/16"),
            std::string::npos) << cmd;
  EXPECT_NE(cmd.find("--mca plm_rsh_agent /opt/agent"), std::string::npos) << cmd;
}

std::string worker_count_error(int64_t nproc, const ClusterFile& cluster, int cores) {
  TrainConfig c;
  c.nproc_per_node = nproc;
  c.cluster = cluster.hosts.empty() ? "" : "cluster.yaml";
  try {
    return "accepted " + std::to_string(checked_worker_count(c, cluster, cores));
  } catch (const UserError& e) {
    return e.what();
  }
}

// nproc_per_node 1000 on 2 cores started 1000 workers, which hung; the tests' 4 to 8 on 2 cores run.
TEST(Launcher, RefusesFarMoreWorkersThanCores) {
  EXPECT_EQ(worker_count_error(4, {}, 2), "accepted 4");
  EXPECT_EQ(worker_count_error(8, {}, 2), "accepted 8");
  EXPECT_EQ(worker_count_error(16, {}, 2), "accepted 16");
  EXPECT_EQ(worker_count_error(1000, {}, 2),
            "nproc_per_node 1000 is more than 8 workers per core of this machine (2 cores: at most 16): so many "
            "processes only wait on each other, and the run would crawl or hang; use nproc_per_node 16 or fewer, or "
            "a cluster file for more machines");
  EXPECT_NE(worker_count_error(17, {}, 2).find("at most 16"), std::string::npos);
  EXPECT_EQ(worker_count_error(1000, {}, 128), "accepted 1000");
  EXPECT_GE(usable_cores(), 1);
}

TEST(Launcher, RefusesMoreWorkersPerNodeThanTheClusterHasSlots) {
  const ClusterFile cluster{{{"node1", 8}, {"node2", 4}}, "", ""};
  EXPECT_EQ(worker_count_error(1, cluster, 2), "accepted 12");  // one per slot, whatever the cores here
  EXPECT_EQ(worker_count_error(4, cluster, 2), "accepted 12");
  EXPECT_EQ(worker_count_error(1000, cluster, 2),
            "nproc_per_node 1000 is more than the 8 slots of host node1 in cluster file cluster.yaml: a cluster run "
            "starts one worker per slot of each host; set the hosts' slots there, or leave nproc_per_node out");
  EXPECT_NE(worker_count_error(8, cluster, 2).find("the 4 slots of host node2"), std::string::npos);
}

}  // namespace
}  // namespace fab
