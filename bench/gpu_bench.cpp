// Fabrica's side of the GPU benchmark (bench/gpu_bench.py runs PyTorch's): training steps of a
// Llama-style decoder on CUDA, built from nn/ops (tests/gpu/ops_decoder.h, since
// models/DecoderModel is CPU-only for now), bf16 compute with fp32 master weights, AdamW.
// Prints one JSON line: tokens/s, model TFLOP/s, MFU against 989 TFLOP/s (H100/H200 dense bf16),
// peak device memory. Default shape: the ~1B Llama of bench/GPU_BENCH.md.
//   fabrica_gpu_bench [--layers 16] [--batch 4] [--seq 2048] [--steps 6] [--max-seconds 90] [--fp32]
//                     [--hidden 2048] [--cpu]   (--cpu --hidden 256 ...: a smoke check without a GPU)
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/error.h"
#include "kernels/cuda/cuda_allocator.h"
#include "ops_decoder.h"

namespace {

int64_t flag(int argc, char** argv, const char* name, int64_t fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (!std::strcmp(argv[i], name)) return std::atoll(argv[i + 1]);
  return fallback;
}

bool has(int argc, char** argv, const char* name) {
  for (int i = 1; i < argc; ++i)
    if (!std::strcmp(argv[i], name)) return true;
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace fab;
  using namespace fab::test;
  try {
    const bool on_cpu = has(argc, argv, "--cpu");  // a smoke check of this program on a small shape
    Backend& cuda = backend(DeviceKind::cuda);
    if (!on_cpu && !cuda.available()) {
      std::printf("{\"skipped\": \"%s\"}\n", cuda.name().c_str());
      return 0;
    }
    OpsDecoderConfig c;
    c.vocab = 32000, c.hidden = flag(argc, argv, "--hidden", 2048), c.heads = c.hidden / 64, c.kv_heads = c.heads / 4;
    c.head_dim = 64, c.intermediate = c.hidden * 11 / 4;  // 5632 at hidden 2048
    c.layers = flag(argc, argv, "--layers", 16);
    c.batch = flag(argc, argv, "--batch", 4);
    c.seq = flag(argc, argv, "--seq", 2048);
    c.ce_chunk_rows = 4096;
    c.init_std = 0.02;
    const int64_t steps = flag(argc, argv, "--steps", 6);
    const bool bf16 = !has(argc, argv, "--fp32");
    const Device device = on_cpu ? Device::cpu() : Device::cuda(0);
    OpsDecoder model(c, device, bf16);
    const TokenBatch b = batch_on(random_batch(c, 7, 0), model);
    const double tokens = double(c.batch * c.seq);
    // Model FLOPs per token: 6 per parameter outside the embedding table (the lm_head GEMM counts),
    // plus causal attention's 6 * layers * seq * (heads * head_dim) (QK^T and PV, forward and
    // backward, half the square).
    const double params = double(model.num_parameters() - c.vocab * c.hidden);
    const double flops_per_token = 6.0 * params + 6.0 * double(c.layers * c.seq * c.heads * c.head_dim);
    // Stops early (after at least one timed step) once --max-seconds have passed, so a slow
    // build still reports inside the device check's time limit.
    const double max_seconds = double(flag(argc, argv, "--max-seconds", 90));
    const auto begin = std::chrono::steady_clock::now();
    double timed = 0, loss = 0;
    int64_t timed_steps = 0;
    for (int64_t t = 1; t <= steps; ++t) {
      const auto start = std::chrono::steady_clock::now();
      loss = model.forward_backward(b.ids, b.labels, b.positions, float(1.0 / double(b.targets))) / double(b.targets);
      model.step(t, 1e-4f);
      if (!on_cpu) cudaDeviceSynchronize();
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::fprintf(stderr, "step %lld: loss %.4f, %.3f s\n", (long long)t, loss, s);
      if (t > 1) timed += s, ++timed_steps;  // step 1 warms the caches (allocator, cuBLASLt plans)
      const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
      if (timed_steps > 0 && elapsed > max_seconds) break;
    }
    FAB_CHECK(timed_steps > 0, "no timed step: give --steps 2 or more");
    const double tok_s = tokens * double(timed_steps) / timed, tflops = tok_s * flops_per_token / 1e12;
    Allocator& alloc = backend(device.kind).allocator();
    const double reserved = on_cpu ? 0.0 : double(dynamic_cast<cuda::CudaAllocator&>(alloc).reserved_bytes());
    std::printf(
        "{\"impl\": \"fabrica-%s\", \"precision\": \"%s\", \"layers\": %lld, \"batch\": %lld, \"seq\": %lld, "
        "\"params\": %lld, \"timed_steps\": %lld, \"tokens_per_s\": %.1f, \"model_tflops\": %.2f, \"mfu\": %.4f, "
        "\"peak_in_use_gib\": %.2f, \"reserved_gib\": %.2f, \"final_loss\": %.4f}\n",
        on_cpu ? "cpu" : "cuda", bf16 ? "bf16" : "fp32", (long long)c.layers, (long long)c.batch, (long long)c.seq,
        (long long)model.num_parameters(), (long long)timed_steps, tok_s, tflops, tflops / 989.0, double(alloc.total().peak) / (1 << 30),
        reserved / (1 << 30), loss);
    return 0;
  } catch (const std::exception& e) {
    std::printf("{\"impl\": \"fabrica\", \"error\": \"%s\"}\n", e.what());
    return 1;
  }
}
