// Fabrica's side of the GPU benchmark (bench/gpu_bench.py runs PyTorch's): training steps of a
// Llama-style decoder on CUDA, built from nn/ops (tests/gpu/ops_decoder.h, since
// models/DecoderModel is CPU-only for now), bf16 compute with fp32 master weights, AdamW.
// Prints one JSON line: tokens/s, model TFLOP/s, MFU against 989 TFLOP/s (H100/H200 dense bf16),
// peak device memory. Default shape: the ~1B Llama of bench/GPU_BENCH.md.
//   fabrica_gpu_bench [--layers 16] [--batch 4] [--seq 2048] [--steps 6] [--fp32]
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

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
    Backend& cuda = backend(DeviceKind::cuda);
    if (!cuda.available()) {
      std::printf("{\"skipped\": \"%s\"}\n", cuda.name().c_str());
      return 0;
    }
    OpsDecoderConfig c;
    c.vocab = 32000, c.hidden = 2048, c.heads = 32, c.kv_heads = 8, c.head_dim = 64, c.intermediate = 5632;
    c.layers = flag(argc, argv, "--layers", 16);
    c.batch = flag(argc, argv, "--batch", 4);
    c.seq = flag(argc, argv, "--seq", 2048);
    c.ce_chunk_rows = 4096;
    c.init_std = 0.02;
    const int64_t steps = flag(argc, argv, "--steps", 6);
    const bool bf16 = !has(argc, argv, "--fp32");
    OpsDecoder model(c, Device::cuda(0), bf16);
    const TokenBatch b = batch_on(random_batch(c, 7, 0), model);
    const double tokens = double(c.batch * c.seq);
    // Model FLOPs per token: 6 per parameter outside the embedding table (the lm_head GEMM counts),
    // plus causal attention's 6 * layers * seq * (heads * head_dim) (QK^T and PV, forward and
    // backward, half the square).
    const double params = double(model.num_parameters() - c.vocab * c.hidden);
    const double flops_per_token = 6.0 * params + 6.0 * double(c.layers * c.seq * c.heads * c.head_dim);
    double timed = 0, loss = 0;
    for (int64_t t = 1; t <= steps; ++t) {
      const auto start = std::chrono::steady_clock::now();
      loss = model.forward_backward(b.ids, b.labels, b.positions, float(1.0 / double(b.targets))) / double(b.targets);
      model.step(t, 1e-4f);
      cudaDeviceSynchronize();
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::fprintf(stderr, "step %lld: loss %.4f, %.3f s\n", (long long)t, loss, s);
      if (t > 1) timed += s;  // step 1 warms the caches (allocator, cuBLASLt plans)
    }
    const double tok_s = tokens * double(steps - 1) / timed, tflops = tok_s * flops_per_token / 1e12;
    auto& alloc = dynamic_cast<cuda::CudaAllocator&>(cuda.allocator());
    std::printf(
        "{\"impl\": \"fabrica\", \"precision\": \"%s\", \"layers\": %lld, \"batch\": %lld, \"seq\": %lld, "
        "\"params\": %lld, \"tokens_per_s\": %.1f, \"model_tflops\": %.2f, \"mfu\": %.4f, "
        "\"peak_in_use_gib\": %.2f, \"reserved_gib\": %.2f, \"final_loss\": %.4f}\n",
        bf16 ? "bf16" : "fp32", (long long)c.layers, (long long)c.batch, (long long)c.seq,
        (long long)model.num_parameters(), tok_s, tflops, tflops / 989.0, double(alloc.total().peak) / (1 << 30),
        double(alloc.reserved_bytes()) / (1 << 30), loss);
    return 0;
  } catch (const std::exception& e) {
    std::printf("{\"impl\": \"fabrica\", \"error\": \"%s\"}\n", e.what());
    return 1;
  }
}
