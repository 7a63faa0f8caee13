#include "plan/cluster_spec.h"

#include <omp.h>
#include <yaml-cpp/yaml.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <vector>

#include "config/yaml_file.h"
#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cpu/matmul_onednn.h"

namespace fab {
namespace {

// Vendor figures (dense, no sparsity); links as the bus bandwidth NCCL/HCCL rings reach, not the
// wire rate: NVLink 4 ~360 GB/s of 450, NVLink 3 ~240 of 300, HCCS ~150, 8 x 400 Gb/s
// InfiniBand per 8 devices ~45 GB/s each, 200 Gb/s ~22 GB/s. 2 GB reserved for the CUDA/CANN
// context, communicator buffers and allocator slack.
struct Preset {
  const char* name;
  double memory, bf16, fp32, hbm;
  LinkSpec intra, inter;
};
constexpr double G = 1e9, T = 1e12;
const Preset kPresets[] = {
    {"h100-80g", 80 * G, 989 * T, 67 * T, 3.35 * T, {360 * G, 5e-6}, {45 * G, 10e-6}},
    {"h200-141g", 141 * G, 989 * T, 67 * T, 4.8 * T, {360 * G, 5e-6}, {45 * G, 10e-6}},
    {"a100-80g", 80 * G, 312 * T, 19.5 * T, 2.0 * T, {240 * G, 6e-6}, {22 * G, 12e-6}},
    {"910b-64g", 64 * G, 313 * T, 78 * T, 1.6 * T, {150 * G, 8e-6}, {22 * G, 15e-6}},
};

const Preset& find_preset(const std::string& name) {
  for (const Preset& p : kPresets)
    if (name == p.name) return p;
  throw UserError(format("--device {}: expected h100-80g, h200-141g, a100-80g or 910b-64g", name));
}

double meminfo_bytes(const std::string& key) {
  std::ifstream in("/proc/meminfo");
  std::string name;
  double kib = 0;
  std::string unit;
  while (in >> name >> kib >> unit)
    if (name == key + ":") return kib * 1024;
  return 0;
}

double as_number(const YAML::Node& node, const std::string& key, double fallback, const std::string& path) {
  if (!node || !node[key]) return fallback;
  try {
    return node[key].as<double>();
  } catch (const YAML::Exception&) {
    throw UserError(format("{}: {} must be a number", path, key));
  }
}

}  // namespace

DeviceSpec device_preset(const std::string& name) {
  const Preset& p = find_preset(name);
  DeviceSpec d;
  d.name = p.name;
  d.memory_bytes = p.memory;
  d.peak_flops_bf16 = p.bf16;
  d.peak_flops_fp32 = p.fp32;
  d.gemm_efficiency = 0.7;  // large bf16 GEMMs: 65-75% of the dense peak on these parts
  d.memory_bandwidth = p.hbm;
  d.reserved_bytes = 2 * G;
  d.state_layout = "mixed";
  return d;
}

ClusterSpec preset_cluster(const std::string& device, int devices, int devices_per_node) {
  FAB_USER_CHECK(devices >= 1 && devices_per_node >= 1 && devices % devices_per_node == 0,
                 "--devices {} must be a positive multiple of --devices-per-node {}", devices, devices_per_node);
  const Preset& p = find_preset(device);
  ClusterSpec c;
  c.nodes = devices / devices_per_node;
  c.devices_per_node = devices_per_node;
  c.device = device_preset(device);
  c.intra_node = p.intra;
  c.inter_node = p.inter;
  c.comm_overlap = 0.9;
  return c;
}

// C (n, n) = A B in f32 (or bf16 inputs), repeated until `seconds` have passed.
double measure_gemm_flops(bool bf16, double seconds) {
  const int64_t n = 512;
  std::vector<float> a(size_t(n * n), 0.5f), b(size_t(n * n), 0.25f), c(size_t(n * n));
  std::vector<uint16_t> a16(size_t(n * n), 0x3f00), b16(size_t(n * n), 0x3e80);
  MatmulArgs args;
  args.a = bf16 ? static_cast<const void*>(a16.data()) : a.data();
  args.b = bf16 ? static_cast<const void*>(b16.data()) : b.data();
  args.c = c.data();
  args.m = args.n = args.k = n;
  args.dtype = bf16 ? DType::bf16 : DType::f32;
  cpu::matmul(args);  // warm-up: primitive creation, page faults
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  int64_t reps = 0;
  double elapsed = 0;
  while (elapsed < seconds) {
    cpu::matmul(args);
    ++reps;
    elapsed = std::chrono::duration<double>(clock::now() - start).count();
  }
  return 2.0 * double(n * n * n) * double(reps) / elapsed;
}

ClusterSpec this_machine(int processes) {
  FAB_USER_CHECK(processes >= 1, "nproc_per_node {} must be at least 1", processes);
  const int cores = omp_get_num_procs();
  const char* peak_env = std::getenv("FAB_PEAK_GFLOPS");
  const double share = double(cores) / double(processes);
  const double peak = peak_env ? std::atof(peak_env) * 1e9 : 157.5e9 * share;
  ClusterSpec c;
  c.nodes = 1;
  c.devices_per_node = processes;
  c.device.name = "this machine";
  c.device.memory_bytes = meminfo_bytes("MemTotal") / processes;
  c.device.peak_flops_fp32 = c.device.peak_flops_bf16 = peak;
  // Measured with every core, whatever this process runs with (a worker runs with its share).
  const int threads = omp_get_max_threads();
  omp_set_num_threads(cores);
  c.device.gemm_efficiency = std::min(1.0, measure_gemm_flops(false, 0.2) / double(processes) / peak);
  omp_set_num_threads(threads);
  c.device.memory_bandwidth = 8e9 / processes;  // DRAM a rank streams the optimizer through
  c.device.reserved_bytes = 20e6;  // a worker's resident runtime (binary, oneDNN, MPI); --calibrate measures it
  c.device.state_layout = "fabrica";
  c.device.host = true;
  // The shared-memory ring of bench/RESULTS.md (64 MB all-reduce at 2 ranks: 2.9 GB/s bus).
  c.intra_node = c.inter_node = {2.5e9, 30e-6};
  // The communication thread shares the cores with the compute: the trainer's
  // comm_hidden_fraction is ~0 on this 2-core machine (bench/RESULTS.md, planner section).
  c.comm_overlap = 0;
  return c;
}

ClusterSpec load_cluster_spec(const std::string& path) {
  const YAML::Node root =
      load_yaml_file(path, "a cluster spec (`device:`, as `fabrica plan --calibrate` writes; plan_cluster)");
  FAB_USER_CHECK(root.IsMap() && root["device"], "{}: expected `device:` (a preset name or a map of its figures)",
                 path);
  ClusterSpec c;
  const YAML::Node device = root["device"];
  if (device.IsScalar()) {
    c = preset_cluster(device.as<std::string>(), 1, 1);
  } else {
    const std::string preset = device["preset"] ? device["preset"].as<std::string>() : "";
    if (!preset.empty()) c = preset_cluster(preset, 1, 1);
    DeviceSpec& d = c.device;
    if (device["name"]) d.name = device["name"].as<std::string>();
    d.memory_bytes = as_number(device, "memory_bytes", d.memory_bytes, path);
    d.peak_flops_bf16 = as_number(device, "peak_flops_bf16", d.peak_flops_bf16, path);
    d.peak_flops_fp32 = as_number(device, "peak_flops_fp32", d.peak_flops_fp32, path);
    d.gemm_efficiency = as_number(device, "gemm_efficiency", d.gemm_efficiency, path);
    d.memory_bandwidth = as_number(device, "memory_bandwidth", d.memory_bandwidth, path);
    d.reserved_bytes = as_number(device, "reserved_bytes", d.reserved_bytes, path);
    if (device["state_layout"]) d.state_layout = device["state_layout"].as<std::string>();
    if (device["host"]) d.host = device["host"].as<bool>();
  }
  c.nodes = int(as_number(root, "nodes", 1, path));
  c.devices_per_node = int(as_number(root, "devices_per_node", c.devices_per_node, path));
  c.intra_node.bandwidth = as_number(root["intra_node"], "bandwidth", c.intra_node.bandwidth, path);
  c.intra_node.latency = as_number(root["intra_node"], "latency", c.intra_node.latency, path);
  c.inter_node.bandwidth = as_number(root["inter_node"], "bandwidth", c.inter_node.bandwidth, path);
  c.inter_node.latency = as_number(root["inter_node"], "latency", c.inter_node.latency, path);
  c.comm_overlap = as_number(root, "comm_overlap", c.comm_overlap, path);
  const DeviceSpec& d = c.device;
  FAB_USER_CHECK(c.nodes >= 1 && c.devices_per_node >= 1, "{}: nodes and devices_per_node must be at least 1", path);
  FAB_USER_CHECK(d.memory_bytes > 0 && d.peak_flops_bf16 > 0 && d.peak_flops_fp32 > 0,
                 "{}: device needs memory_bytes, peak_flops_bf16 and peak_flops_fp32 (or a preset)", path);
  FAB_USER_CHECK(d.gemm_efficiency > 0 && d.gemm_efficiency <= 1, "{}: gemm_efficiency {} must lie in (0, 1]", path,
                 d.gemm_efficiency);
  FAB_USER_CHECK(d.state_layout == "mixed" || d.state_layout == "fabrica",
                 "{}: state_layout \"{}\": expected mixed or fabrica", path, d.state_layout);
  FAB_USER_CHECK(c.intra_node.bandwidth > 0 && c.inter_node.bandwidth > 0,
                 "{}: intra_node and inter_node need a bandwidth (bytes/s)", path);
  FAB_USER_CHECK(c.comm_overlap >= 0 && c.comm_overlap <= 1, "{}: comm_overlap must lie in [0, 1]", path);
  return c;
}

std::string cluster_spec_to_yaml(const ClusterSpec& c) {
  const DeviceSpec& d = c.device;
  std::ostringstream out;
  out.precision(6);
  out << "# fabrica plan --cluster FILE: the hardware to plan for (bytes, FLOP/s, seconds)\n"
      << "nodes: " << c.nodes << "\ndevices_per_node: " << c.devices_per_node << "\ndevice:\n"
      << "  name: \"" << d.name << "\"\n  memory_bytes: " << d.memory_bytes << "\n  peak_flops_bf16: "
      << d.peak_flops_bf16 << "\n  peak_flops_fp32: " << d.peak_flops_fp32 << "\n  gemm_efficiency: "
      << d.gemm_efficiency << "\n  memory_bandwidth: " << d.memory_bandwidth << "\n  reserved_bytes: "
      << d.reserved_bytes << "\n  state_layout: " << d.state_layout << "\n  host: " << (d.host ? "true" : "false") << "\nintra_node:\n  bandwidth: "
      << c.intra_node.bandwidth << "\n  latency: " << c.intra_node.latency << "\ninter_node:\n  bandwidth: "
      << c.inter_node.bandwidth << "\n  latency: " << c.inter_node.latency << "\ncomm_overlap: " << c.comm_overlap
      << "\n";
  return out.str();
}

}  // namespace fab
