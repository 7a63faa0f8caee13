#pragma once
// The pieces `fabrica demo` is made of, shared with the tests that train tiny models on synthetic
// tasks: alpaca-format problems, a byte-level BPE tokenizer and a from-scratch Qwen3 folder, the
// SFT and GRPO configs the demo uses, and greedy held-out accuracy through the chatml template.
#include <memory>
#include <string>
#include <vector>

#include "models/decoder.h"
#include "tokenizer/tokenizer.h"

namespace fab {

struct Problem {
  std::string question, answer;
};

void write_alpaca(const std::string& path, const std::vector<Problem>& problems);

// Trains a byte-level BPE tokenizer of `vocab_size` tokens on the problems' text and writes it with
// the config.json of a tiny tied Qwen3 (3 layers, hidden 128) into `dir`; returns the tokenizer.
Tokenizer make_tiny_model_folder(const std::string& dir, const std::vector<Problem>& problems, int64_t vocab_size);

// Loads the model folder `dir` in fp32 (random weights from `seed` where it has none).
std::unique_ptr<DecoderModel> load_tiny_model(const std::string& dir, uint64_t seed = 7);

// Greedy answers (at most `max_new_tokens`) through the chatml template; the fraction answered
// exactly. The first `show` problems are printed with their verdicts.
double greedy_accuracy(DecoderModel& model, const Tokenizer& tokenizer, const std::vector<Problem>& problems,
                       size_t show = 0, int64_t max_new_tokens = 6);

// What every demo run shares: chatml, cutoff 32, `steps` steps logged 10 times, no checkpoints, seed 7.
std::string demo_common_yaml(const std::string& model, const std::string& dataset, const std::string& output_dir,
                             const std::string& cache_dir, int steps);

// The demo's SFT run: chatml, cutoff 32, batch 32, lr 3e-3 cosine, `steps` steps from `model`.
std::string demo_sft_yaml(const std::string& model, const std::string& dataset, const std::string& output_dir,
                          const std::string& cache_dir, int steps);

// stage grpo from `model` with the exact-match reward, 8 prompts x 8 samples at temperature 1, lr
// 1e-4 constant; `extra` is appended (YAML lines, e.g. the update settings).
std::string demo_grpo_yaml(const std::string& model, const std::string& dataset, const std::string& output_dir,
                           const std::string& cache_dir, int steps, const std::string& extra = "");

}  // namespace fab
