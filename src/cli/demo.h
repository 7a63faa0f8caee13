#pragma once

namespace fab {
// `fabrica demo`: trains a small byte-level Llama from scratch on built-in text and prints the
// loss as it falls, then a greedy continuation. Returns the process exit code.
int run_demo(int steps);
}  // namespace fab
