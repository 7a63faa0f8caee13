#pragma once
#include <string>

namespace fab {
// `fabrica demo`: synthetic addition task, BPE tokenizer, tiny Qwen3 from scratch, accuracy before
// and after training. Everything it makes goes under `work`. Returns the process exit code.
int run_demo(int steps, const std::string& work);
}  // namespace fab
