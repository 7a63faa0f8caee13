#pragma once
#include <string>

namespace fab {
// `fabrica demo`: synthetic addition task, BPE tokenizer, tiny Qwen3 from scratch, accuracy before
// and after training. Everything it makes goes under `work`. Returns the process exit code.
int run_demo(int steps, const std::string& work);
// `fabrica demo --rl [--stage ppo]`: the same task, a model fine-tuned only `sft_steps`, then
// `rl_steps` of `stage` (grpo or ppo) with the exact-match reward; held-out accuracy before and after.
int run_demo_rl(int sft_steps, int rl_steps, const std::string& work, const std::string& stage = "grpo");
}  // namespace fab
