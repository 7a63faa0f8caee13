#include "launch/host_probe.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <set>
#include <sstream>
#include <thread>

#include "core/error.h"

extern char** environ;

namespace fab {
namespace {

std::vector<std::string> probe_command(const std::string& rsh_agent, const std::string& host) {
  std::vector<std::string> words;
  std::istringstream in(rsh_agent);
  for (std::string w; in >> w;) words.push_back(w);
  if (words.empty()) words = {"ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5"};
  words.insert(words.end(), {host, "true"});
  return words;
}

// The exit status of `pid`, waiting at most until `deadline`; -1 (and the process killed) past it.
int exit_status_by(pid_t pid, std::chrono::steady_clock::time_point deadline) {
  int status = 0;
  for (;;) {
    const pid_t done = ::waitpid(pid, &status, WNOHANG);
    if (done == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    if (done < 0 && errno != EINTR) return -1;
    if (std::chrono::steady_clock::now() >= deadline) {
      ::kill(-pid, SIGKILL);  // its process group: an ssh and whatever it started
      ::waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace

bool host_answers(const std::string& rsh_agent, const std::string& host, std::chrono::milliseconds timeout) {
  const std::vector<std::string> command = probe_command(rsh_agent, host);
  std::vector<char*> argv;
  for (const std::string& a : command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t files;
  posix_spawn_file_actions_init(&files);
  for (int fd : {STDIN_FILENO, STDOUT_FILENO, STDERR_FILENO})
    posix_spawn_file_actions_addopen(&files, fd, "/dev/null", fd == STDIN_FILENO ? O_RDONLY : O_WRONLY, 0);
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETPGROUP);  // group 0: its own, killed whole on timeout
  pid_t pid = -1;
  const int error = ::posix_spawnp(&pid, argv[0], &files, &attributes, argv.data(), environ);
  posix_spawn_file_actions_destroy(&files);
  posix_spawnattr_destroy(&attributes);
  if (error != 0) return false;
  return exit_status_by(pid, std::chrono::steady_clock::now() + timeout) == 0;
}

HostSelection select_hosts(const ClusterFile& cluster, int64_t min_nodes, int tries, std::chrono::milliseconds pause,
                           const std::function<bool(const std::string& host)>& probe) {
  FAB_USER_CHECK(min_nodes <= int64_t(cluster.hosts.size()), "min_nodes {} is more than the {} hosts of the cluster file",
                 min_nodes, cluster.hosts.size());
  std::set<std::string> answered;
  for (int t = 0; t < tries && answered.size() < cluster.hosts.size(); ++t) {
    if (t > 0) std::this_thread::sleep_for(pause);
    for (const ClusterHost& h : cluster.hosts)
      if (!answered.count(h.name) && probe(h.name)) answered.insert(h.name);
  }
  HostSelection s;
  s.cluster = cluster;
  s.cluster.hosts.clear();
  for (const ClusterHost& h : cluster.hosts) {
    if (answered.count(h.name))
      s.cluster.hosts.push_back(h);
    else
      s.left_out.push_back(h.name);
  }
  std::string names;
  for (const std::string& n : s.left_out) names += (names.empty() ? "" : ", ") + n;
  FAB_USER_CHECK(int64_t(s.cluster.hosts.size()) >= min_nodes,
                 "only {} of {} hosts of the cluster answered (min_nodes {}); unreachable after {} tries: {}",
                 s.cluster.hosts.size(), cluster.hosts.size(), min_nodes, tries, names);
  return s;
}

}  // namespace fab
