#include "parallel/mesh.h"

#include <algorithm>
#include <set>

#include "core/error.h"

namespace fab {

int ParallelSizes::of(const std::string& dim) const {
  if (dim == "tp") return tp;
  if (dim == "cp") return cp;
  if (dim == "dp") return dp;
  if (dim == "pp") return pp;
  throw UserError(format("unknown parallel dimension '{}' (expected tp, cp, dp or pp)", dim));
}

std::vector<std::string> parse_mesh_order(const std::string& order) {
  std::vector<std::string> dims;
  size_t start = 0;
  while (start <= order.size()) {
    const size_t dash = std::min(order.find('-', start), order.size());
    dims.push_back(order.substr(start, dash - start));
    start = dash + 1;
  }
  std::vector<std::string> sorted = dims;
  std::sort(sorted.begin(), sorted.end());
  FAB_USER_CHECK(sorted == std::vector<std::string>({"cp", "dp", "pp", "tp"}),
                 "mesh order '{}': expected each of tp, cp, dp, pp once, joined by '-' (e.g. tp-cp-dp-pp)", order);
  return dims;
}

// rank = sum over dimensions of coordinate * stride, the first dimension of `order` with stride 1.
std::map<std::string, int> mesh_coordinates(int rank, const ParallelSizes& sizes, const std::string& order) {
  std::map<std::string, int> coords;
  for (const std::string& dim : parse_mesh_order(order)) {
    coords[dim] = rank % sizes.of(dim);
    rank /= sizes.of(dim);
  }
  return coords;
}

std::vector<std::vector<int>> mesh_groups(int world_size, const ParallelSizes& sizes, const std::string& order,
                                          const std::string& dim) {
  FAB_USER_CHECK(sizes.tp * sizes.cp * sizes.dp * sizes.pp == world_size,
                 "tp {} x cp {} x dp {} x pp {} = {} ranks, but the world has {}", sizes.tp, sizes.cp, sizes.dp,
                 sizes.pp, sizes.tp * sizes.cp * sizes.dp * sizes.pp, world_size);
  std::vector<std::string> dims;  // `dim` may join several: "cp-dp"
  for (size_t start = 0; start <= dim.size();) {
    const size_t dash = std::min(dim.find('-', start), dim.size());
    dims.push_back(dim.substr(start, dash - start));
    sizes.of(dims.back());
    start = dash + 1;
  }
  std::map<std::vector<int>, std::vector<int>> by_rest;  // the other coordinates -> ranks
  for (int r = 0; r < world_size; ++r) {
    auto c = mesh_coordinates(r, sizes, order);
    for (const std::string& d : dims) c.erase(d);
    std::vector<int> rest;
    for (const auto& [name, value] : c) rest.push_back(value);
    by_rest[rest].push_back(r);  // r increases, and so does the coordinate along dim
  }
  std::vector<std::vector<int>> groups;
  for (auto& [rest, ranks] : by_rest) groups.push_back(ranks);
  std::sort(groups.begin(), groups.end());
  return groups;
}

DeviceMesh::DeviceMesh(Communicator& world, const ParallelSizes& sizes, const std::string& order)
    : sizes_(sizes), coords_(mesh_coordinates(world.rank(), sizes, order)) {
  std::vector<std::string> dims = parse_mesh_order(order);
  dims.push_back("cp-dp");
  for (const std::string& dim : dims) {
    const auto groups = mesh_groups(world.size(), sizes, order, dim);
    int color = 0, key = 0;
    for (size_t g = 0; g < groups.size(); ++g)
      for (size_t i = 0; i < groups[g].size(); ++i)
        if (groups[g][i] == world.rank()) color = int(g), key = int(i);
    groups_[dim] = world.split(color, key);
  }
}

Communicator& DeviceMesh::group(const std::string& dim) const {
  auto it = groups_.find(dim);
  FAB_USER_CHECK(it != groups_.end(), "unknown parallel dimension '{}'", dim);
  return *it->second;
}

Communicator* DeviceMesh::device_group(const std::string& dim) {
  Communicator& host = group(dim);
  if (!make_device_group_ || host.size() == 1) return nullptr;
  std::unique_ptr<Communicator>& made = device_groups_[dim];
  if (!made) made = make_device_group_(host);
  return made.get();
}

}  // namespace fab
