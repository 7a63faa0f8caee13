// Trains the standard bench model (Llama-style: hidden 256, 4 layers, 4 heads, intermediate 704,
// vocab 8192, sequence 256, batch 8, AdamW) on random tokens and prints one JSON line. The
// PyTorch peer (bench/torch_peer.py) does the same work; bench/run_bench.sh compares them.
#include <omp.h>
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/rng.h"
#include "models/decoder.h"
#include "optim/adamw.h"

namespace {

struct Flags {
  std::string precision = "fp32";
  int warmup = 2, steps = 8, threads = 2;
  bool recompute = false;
};

Flags parse(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&] {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "fabrica_bench: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return std::string(argv[++i]);
    };
    if (a == "--precision") f.precision = next();
    else if (a == "--warmup") f.warmup = std::stoi(next());
    else if (a == "--steps") f.steps = std::stoi(next());
    else if (a == "--threads") f.threads = std::stoi(next());
    else if (a == "--recompute") f.recompute = true;
    else {
      std::fprintf(stderr, "usage: fabrica_bench [--precision fp32|bf16] [--warmup N] [--steps N] [--threads N] [--recompute]\n");
      std::exit(2);
    }
  }
  if (f.precision != "fp32" && f.precision != "bf16") {
    std::fprintf(stderr, "fabrica_bench: --precision must be fp32 or bf16\n");
    std::exit(2);
  }
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace fab;
  const Flags flags = parse(argc, argv);
  omp_set_num_threads(flags.threads);

  ModelConfig cfg;
  cfg.model_type = "llama";
  cfg.vocab_size = 8192;
  cfg.hidden_size = 256;
  cfg.intermediate_size = 704;
  cfg.num_hidden_layers = 4;
  cfg.num_attention_heads = 4;
  cfg.num_key_value_heads = 4;
  cfg.head_dim = 64;
  cfg.rope_theta = 10000;
  cfg.rms_norm_eps = 1e-6;
  const int64_t batch = 8, seq = 256;

  DecoderOptions options;
  options.precision = flags.precision == "bf16" ? Precision::bf16 : Precision::fp32;
  options.recompute_layers = flags.recompute;
  options.max_seq_len = seq;
  DecoderModel model(cfg, options);
  model.init_random(1234);
  AdamW optimizer(model.params(), {0.9f, 0.95f, 1e-8f, 0.1f});

  // A fresh random batch every step, all made before timing (as the PyTorch peer does).
  Rng rng(42);
  std::vector<Tensor> batches;
  for (int step = 0; step < flags.warmup + flags.steps; ++step) {
    Tensor ids = Tensor::empty({batch, seq}, DType::i64, MemoryCategory::activations);
    for (int64_t i = 0; i < ids.numel(); ++i) ids.data<int64_t>()[i] = int64_t(rng.next_u64() % cfg.vocab_size);
    batches.push_back(ids);
  }

  double loss = 0, seconds = 0;
  for (int step = 0; step < flags.warmup + flags.steps; ++step) {
    auto start = std::chrono::steady_clock::now();
    const Tensor& ids = batches[size_t(step)];
    const int64_t targets = DecoderModel::count_targets(ids);
    model.params().grads().zero_();
    loss = model.forward_backward(ids, ids, 1.0f / float(targets)) / double(targets);
    clip_grad_norm(model.params(), 1.0);
    optimizer.step(3e-4f);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (step >= flags.warmup) seconds += s;
  }
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  const double tokens = double(batch * seq) * flags.steps;
  std::printf(
      "{\"impl\":\"fabrica\",\"precision\":\"%s\",\"threads\":%d,\"tokens_per_s\":%.1f,\"step_ms\":%.1f,"
      "\"peak_rss_mb\":%.1f,\"final_loss\":%.4f,\"kernels\":\"%s\"}\n",
      flags.precision.c_str(), flags.threads, tokens / seconds, 1000.0 * seconds / flags.steps,
      double(usage.ru_maxrss) / 1024.0, loss, backend(DeviceKind::cpu).name().c_str());
  return 0;
}
