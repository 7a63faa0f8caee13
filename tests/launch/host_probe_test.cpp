// min_nodes: which hosts of a cluster file a launch keeps, and the probe that asks each one.
#include "launch/host_probe.h"

#include <gtest/gtest.h>

#include <chrono>
#include <map>

#include "core/error.h"

namespace fab {
namespace {

using std::chrono::milliseconds;

ClusterFile three_hosts() {
  ClusterFile c;
  c.hosts = {{"node1", 2}, {"node2", 2}, {"node3", 4}};
  c.iface = "eth0";
  return c;
}

TEST(HostProbe, LeavesOutAHostThatNeverAnswers) {
  std::map<std::string, int> asked;
  const HostSelection s = select_hosts(three_hosts(), 2, 3, milliseconds(0), [&](const std::string& host) {
    ++asked[host];
    return host != "node2";
  });
  ASSERT_EQ(s.cluster.hosts.size(), 2u);
  EXPECT_EQ(s.cluster.hosts[0].name, "node1");
  EXPECT_EQ(s.cluster.hosts[1].name, "node3");
  EXPECT_EQ(s.cluster.total_slots(), 6);
  EXPECT_EQ(s.cluster.iface, "eth0");
  EXPECT_EQ(s.left_out, std::vector<std::string>{"node2"});
  // Asked again each round only while it has not answered.
  EXPECT_EQ(asked["node1"], 1);
  EXPECT_EQ(asked["node2"], 3);
}

TEST(HostProbe, AHostThatAnswersOnALaterTryStays) {
  int tries = 0;
  const HostSelection s =
      select_hosts(three_hosts(), 3, 3, milliseconds(0), [&](const std::string& host) { return host != "node3" || ++tries == 2; });
  EXPECT_EQ(s.cluster.hosts.size(), 3u);
  EXPECT_TRUE(s.left_out.empty());
}

TEST(HostProbe, FewerThanMinNodesIsAUserErrorNamingTheHosts) {
  try {
    select_hosts(three_hosts(), 2, 2, milliseconds(0), [](const std::string& host) { return host == "node1"; });
    FAIL() << "no error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("only 1 of 3 hosts of the cluster answered (min_nodes 2)"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("node2, node3"), std::string::npos) << e.what();
  }
  EXPECT_THROW(select_hosts(three_hosts(), 4, 1, milliseconds(0), [](const std::string&) { return true; }), UserError);
}

TEST(HostProbe, RunsTheAgentAndHonoursItsExitCodeAndTheTimeout) {
  // `AGENT HOST true`: here sh -c runs the "host" as a command. The limits are generous (they
  // end as soon as the agent does): a loaded machine may take seconds to start a shell.
  EXPECT_TRUE(host_answers("sh -c", "exit 0", milliseconds(120000)));
  EXPECT_FALSE(host_answers("sh -c", "exit 3", milliseconds(120000)));
  EXPECT_FALSE(host_answers("/nonexistent/agent", "node1", milliseconds(120000)));
  const auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(host_answers("sh -c", "sleep 600", milliseconds(300)));  // never answers: killed
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(120));
}

}  // namespace
}  // namespace fab
