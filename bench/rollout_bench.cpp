// Rollout throughput: the standard bench model's layers (Llama-style, hidden 256, 4 layers, vocab
// 8192) sampling `--prompts` random prompts of 16-48 tokens, `--new-tokens` each (no stop id, so
// every response is full length), `--batch` at a time through the rollout engine, temperature 1,
// top-p 1. `--write DIR` saves the model (random weights, seed 1234) and the prompts
// (prompts.json) so bench/hf_generate_peer.py runs the same work in transformers; `--model DIR`
// then loads them. Prints one JSON line: generated tokens/s of the timed run (after one untimed
// warm-up rollout of `--batch` prompts), and tokens per CPU-second of the process.
#include <omp.h>
#include <sys/resource.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/backend.h"
#include "core/rng.h"
#include "infer/rollout.h"
#include "models/hf_model.h"

namespace {

struct Flags {
  std::string precision = "fp32", write_dir, model_dir;
  int64_t prompts = 64, new_tokens = 64, batch = 16;
  int threads = 2;
};

Flags parse(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw std::runtime_error(a + " needs a value");
      return argv[++i];
    };
    if (a == "--precision") f.precision = next();
    else if (a == "--write") f.write_dir = next();
    else if (a == "--model") f.model_dir = next();
    else if (a == "--prompts") f.prompts = std::stoll(next());
    else if (a == "--new-tokens") f.new_tokens = std::stoll(next());
    else if (a == "--batch") f.batch = std::stoll(next());
    else if (a == "--threads") f.threads = std::stoi(next());
    else throw std::runtime_error("usage: fabrica_rollout_bench (--write DIR | --model DIR [--precision fp32|bf16] "
                                  "[--prompts N] [--new-tokens N] [--batch N] [--threads N])");
  }
  return f;
}

fab::ModelConfig bench_config() {
  fab::ModelConfig c;
  c.model_type = "llama";
  c.vocab_size = 8192;
  c.hidden_size = 256;
  c.intermediate_size = 704;
  c.num_hidden_layers = 4;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 4;
  c.head_dim = 64;
  c.rope_theta = 10000;
  c.rms_norm_eps = 1e-6;
  c.max_position_embeddings = 256;
  return c;
}

int write_model(const Flags& f) {
  fab::DecoderModel model(bench_config(), fab::DecoderOptions(fab::Precision::fp32, false, 256));
  model.init_random(1234);
  fab::save_model_folder(model, f.write_dir);
  fab::Rng rng(7);
  nlohmann::json prompts = nlohmann::json::array();
  for (int64_t i = 0; i < 4096; ++i) {  // more than any run takes; a run uses the first --prompts
    std::vector<int32_t> p(size_t(16 + rng.next_u64() % 33));
    for (int32_t& t : p) t = int32_t(rng.next_u64() % 8192);
    prompts.push_back(p);
  }
  std::ofstream(std::filesystem::path(f.write_dir) / "prompts.json") << prompts.dump();
  return 0;
}

std::vector<fab::RolloutRequest> read_prompts(const std::string& dir, int64_t n) {
  const nlohmann::json all = nlohmann::json::parse(std::ifstream(std::filesystem::path(dir) / "prompts.json"));
  std::vector<fab::RolloutRequest> requests;
  for (int64_t i = 0; i < n; ++i) requests.push_back({all.at(size_t(i)).get<std::vector<int32_t>>(), uint64_t(i)});
  return requests;
}

// User + system time of the whole process so far: on a shared machine, tokens per CPU-second
// say how much work a token costs whatever share of the cores the run got.
double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + 1e-6 * double(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace fab;
  try {
    const Flags f = parse(argc, argv);
    if (!f.write_dir.empty()) return write_model(f);
    omp_set_num_threads(f.threads);
    const Precision precision = f.precision == "bf16" ? Precision::bf16 : Precision::fp32;
    auto model = load_model_folder(f.model_dir, DecoderOptions(precision, false, 256));
    SamplingOptions o;
    o.max_new_tokens = f.new_tokens;
    o.temperature = 1.0;
    o.top_p = 1.0;
    const std::vector<RolloutRequest> requests = read_prompts(f.model_dir, f.prompts);
    rollout(*model, {requests.begin(), requests.begin() + std::min<int64_t>(f.batch, f.prompts)}, o, f.batch);
    RolloutStats stats;
    const double cpu_before = cpu_seconds();
    rollout(*model, requests, o, f.batch, &stats);
    const double cpu = cpu_seconds() - cpu_before;
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    std::printf("{\"impl\":\"fabrica\",\"precision\":\"%s\",\"threads\":%d,\"prompts\":%lld,\"new_tokens\":%lld,"
                "\"batch\":%lld,\"generated_tokens\":%lld,\"seconds\":%.3f,\"tokens_per_s\":%.1f,"
                "\"cpu_seconds\":%.3f,\"tokens_per_cpu_s\":%.1f,\"peak_rss_mb\":%.1f}\n",
                f.precision.c_str(), f.threads, (long long)f.prompts, (long long)f.new_tokens, (long long)f.batch,
                (long long)stats.generated_tokens, stats.seconds, double(stats.generated_tokens) / stats.seconds, cpu,
                double(stats.generated_tokens) / cpu, double(usage.ru_maxrss) / 1024.0);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fabrica_rollout_bench: %s\n", e.what());
    return 1;
  }
}
