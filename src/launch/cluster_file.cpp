#include "launch/cluster_file.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <set>

#include "config/yaml_file.h"
#include "core/error.h"
#include "core/file_write.h"

namespace fab {

int ClusterFile::total_slots() const {
  int n = 0;
  for (const ClusterHost& h : hosts) n += h.slots;
  return n;
}

void check_host_names(const std::vector<ClusterHost>& hosts, const std::string& where) {
  std::set<std::string> seen;
  for (const ClusterHost& h : hosts) {
    const bool valid = !h.name.empty() && h.name[0] != '-' &&
                       std::all_of(h.name.begin(), h.name.end(), [](unsigned char ch) {
                         return std::isalnum(ch) || ch == '.' || ch == '-' || ch == '_' || ch == ':';
                       });
    FAB_USER_CHECK(valid, "{}: host \"{}\" is not a host name or address (letters, digits, '.', '-', '_' and ':' "
                   "only, no spaces)", where, h.name);
    FAB_USER_CHECK(seen.insert(h.name).second, "{}: host {} is listed twice: give each host once, with its slots "
                   "(workers) on it", where, h.name);
  }
}

ClusterFile load_cluster_file(const std::string& path) {
  const YAML::Node root = load_yaml_file(path, "a cluster file (`hosts:`, each {name, slots})");
  ClusterFile c;
  try {
    FAB_USER_CHECK(root["hosts"] && root["hosts"].IsSequence() && root["hosts"].size() > 0,
                   "{}: expected `hosts:` with at least one {name, slots} entry", path);
    for (const auto& h : root["hosts"]) {
      ClusterHost host{h["name"].as<std::string>(), h["slots"] ? h["slots"].as<int>() : 1};
      FAB_USER_CHECK(!host.name.empty() && host.slots > 0, "{}:{}: a host needs a name and slots > 0", path,
                     h.Mark().line + 1);
      c.hosts.push_back(host);
    }
    check_host_names(c.hosts, path);
    if (root["iface"]) c.iface = root["iface"].as<std::string>();
    if (root["rsh_agent"]) c.rsh_agent = root["rsh_agent"].as<std::string>();
  } catch (const YAML::Exception& e) {
    throw UserError(format("{}:{}: {}", path, e.mark.line + 1, e.msg));
  }
  return c;
}

void save_cluster_file(const std::string& path, const ClusterFile& c) {
  YAML::Emitter out;
  out << YAML::BeginMap << YAML::Key << "hosts" << YAML::Value << YAML::BeginSeq;
  for (const ClusterHost& h : c.hosts)
    out << YAML::Flow << YAML::BeginMap << YAML::Key << "name" << YAML::Value << h.name << YAML::Key << "slots"
        << YAML::Value << h.slots << YAML::EndMap;
  out << YAML::EndSeq;
  if (!c.iface.empty()) out << YAML::Key << "iface" << YAML::Value << c.iface;
  if (!c.rsh_agent.empty()) out << YAML::Key << "rsh_agent" << YAML::Value << c.rsh_agent;
  out << YAML::EndMap;
  write_file_atomically(path, std::string(out.c_str()) + "\n");
}

}  // namespace fab
