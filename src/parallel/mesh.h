#pragma once
// The rank grid. world = tp x cp x dp x pp ranks; `order` lists the dimensions fastest-varying
// first (Megatron's "tp-cp-dp-pp": tensor-parallel peers are neighbouring ranks, so they share a
// node). Every process group comes from mesh_groups(); groups are passed around explicitly as
// Communicators, never held in global state, so two meshes can live side by side. tp, dp and pp
// may each exceed 1 (parallelize.h applies them), and cp beside them (parallel_model.h). Beside
// the four dimensions, the mesh holds the group "cp-dp": the ranks of one tensor and pipeline
// place, over which context parallel's gradients are summed and ZeRO shards (as Megatron does).
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace fab {

struct ParallelSizes {
  int tp = 1, cp = 1, dp = 1, pp = 1;
  int of(const std::string& dim) const;
};

// The dimension names of `order` ("tp-cp-dp-pp" or any permutation); throws on a bad order.
std::vector<std::string> parse_mesh_order(const std::string& order);

// Coordinates of `rank` along each dimension.
std::map<std::string, int> mesh_coordinates(int rank, const ParallelSizes& sizes, const std::string& order);

// Every group along `dim` (or several dimensions joined by '-', e.g. "cp-dp"): the world ranks
// that differ only in those coordinates, each group in rank order, groups ordered by their first rank.
std::vector<std::vector<int>> mesh_groups(int world_size, const ParallelSizes& sizes, const std::string& order,
                                          const std::string& dim);

class DeviceMesh {
 public:
  DeviceMesh(Communicator& world, const ParallelSizes& sizes, const std::string& order = "tp-cp-dp-pp");
  // This rank's group along `dim` (tp, cp, dp, pp or cp-dp).
  Communicator& group(const std::string& dim) const;
  // Collectives over device memory (NCCL for CUDA): `make` turns a host group into the same
  // group's device collectives. Without it, or for a group of one, device_group is nullptr and
  // the host group serves (host memory).
  using DeviceCollectives = std::function<std::unique_ptr<Communicator>(Communicator& host_group)>;
  void set_device_collectives(DeviceCollectives make) { make_device_group_ = std::move(make); }
  Communicator* device_group(const std::string& dim);
  int coordinate(const std::string& dim) const { return coords_.at(dim); }
  const ParallelSizes& sizes() const { return sizes_; }

 private:
  ParallelSizes sizes_;
  std::map<std::string, int> coords_;
  std::map<std::string, std::unique_ptr<Communicator>> groups_;
  DeviceCollectives make_device_group_;
  std::map<std::string, std::unique_ptr<Communicator>> device_groups_;  // made on first use
};

}  // namespace fab
