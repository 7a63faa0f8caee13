#pragma once
// The hardware a plan is made for: nodes of identical devices, each with its memory, peak FLOP/s
// and the GEMM efficiency it sustains, and an alpha-beta link inside a node and between nodes.
// Built-in presets (h100-80g, h200-141g, a100-80g, 910b-64g), this machine (memory from
// /proc/meminfo, GEMM rate measured), or a cluster file (YAML, written by `fabrica plan
// --calibrate`).
#include <string>

namespace fab {

struct DeviceSpec {
  std::string name;
  double memory_bytes = 0;
  double peak_flops_bf16 = 0, peak_flops_fp32 = 0;
  double gemm_efficiency = 1;      // sustained GEMM rate / peak
  double memory_bandwidth = 0;     // bytes/s, for the optimizer step (memory-bound)
  double reserved_bytes = 0;       // what a process holds before any model state: runtime, context
  // How a parameter's state is stored: "mixed" = the DeepSpeed/Megatron bf16 layout (2 + 2 + 12
  // bytes), "fabrica" = Fabrica's own (fp32 weights, gradients and moments, plus a bf16 copy
  // under bf16). This machine uses "fabrica": it is what the validation runs measure.
  std::string state_layout = "mixed";
  bool host = false;  // the device's memory is the host's (this machine): the tokenizer counts too
};

struct LinkSpec {
  double bandwidth = 0;  // bytes/s each rank sends in a ring step (bus bandwidth)
  double latency = 0;    // seconds per message
};

struct ClusterSpec {
  int nodes = 1, devices_per_node = 1;
  DeviceSpec device;
  LinkSpec intra_node, inter_node;
  // The fraction of the backward pass that data-parallel communication can hide behind.
  double comm_overlap = 0.9;
  int devices() const { return nodes * devices_per_node; }
};

// A named preset: h100-80g | h200-141g | a100-80g | 910b-64g. UserError for any other name.
DeviceSpec device_preset(const std::string& name);
// The interconnect of a preset's usual node (NVLink/HCCS inside, InfiniBand/RoCE between).
ClusterSpec preset_cluster(const std::string& device, int devices, int devices_per_node);

// This machine shared by `processes` ranks: each gets MemTotal / processes of memory and
// cores / processes of the compute; peak from FAB_PEAK_GFLOPS (per process), or the trainer's
// 157.5 GFLOP/s per core; the GEMM efficiency from a short measured GEMM.
ClusterSpec this_machine(int processes);
double measure_gemm_flops(bool bf16, double seconds);  // the whole process, every thread

ClusterSpec load_cluster_spec(const std::string& path);
std::string cluster_spec_to_yaml(const ClusterSpec& cluster);

}  // namespace fab
