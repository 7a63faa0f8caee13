// fabrica tokenizer train: everything is checked (inputs readable, sizes, output folder) before the
// training starts, so bad input fails at once and writes nothing.
#include "cli/tokenizer_train_command.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "cli/args.h"
#include "core/error.h"
#include "tokenizer/bpe_trainer.h"

namespace fab {
namespace {

constexpr const char* kUsage =
    "usage: fabrica tokenizer train --input FILE[,FILE...] --vocab-size N --output DIR "
    "[--special-tokens TOK[,TOK...]] [--min-frequency N]\n"
    "  --vocab-size counts the 256 bytes, the merged tokens and the special tokens\n"
    "  --special-tokens default <|endoftext|>,<|im_start|>,<|im_end|> ('' for none); they get the last ids\n"
    "  --min-frequency default 2: stop merging once the best pair occurs fewer times";

// "a,b,,c" -> {"a", "b", "c"}.
std::vector<std::string> comma_list(const std::string& text) {
  std::vector<std::string> items;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    if (end > start) items.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return items;
}

int64_t whole_number(const Args& args, const std::string& name, double fallback) {
  const double v = args.get_number(name, fallback);
  FAB_USER_CHECK(std::floor(v) == v && std::fabs(v) < 1e15, "--{} expects a whole number, got \"{}\"", name,
                 args.get(name));
  return int64_t(v);
}

std::vector<std::string> checked_inputs(const std::string& list) {
  const std::vector<std::string> files = comma_list(list);
  FAB_USER_CHECK(!files.empty(), "--input names no file");
  for (const std::string& f : files) {
    std::error_code ec;
    FAB_USER_CHECK(std::filesystem::exists(f, ec), "{}: no such file", f);
    FAB_USER_CHECK(std::filesystem::is_regular_file(f, ec), "{}: not a regular file", f);
    FAB_USER_CHECK(::access(f.c_str(), R_OK) == 0, "{}: not readable", f);
  }
  return files;
}

}  // namespace

int run_tokenizer_train(int argc, char** argv) {
  Args args(argc, argv, 3, {"input", "vocab-size", "output", "special-tokens", "min-frequency"}, {"help"});
  if (args.flag("help")) {
    std::printf("%s\n", kUsage);
    return 0;
  }
  FAB_USER_CHECK(args.has("input") && args.has("vocab-size") && args.has("output") && args.positional().empty(),
                 "{}", kUsage);
  BpeTrainerOptions options;
  options.vocab_size = whole_number(args, "vocab-size", 0);
  options.min_frequency = whole_number(args, "min-frequency", double(options.min_frequency));
  if (args.has("special-tokens")) options.special_tokens = comma_list(args.get("special-tokens"));
  const std::vector<std::string> inputs = checked_inputs(args.get("input"));
  BpeTrainer trainer(options);  // checks the sizes and the special tokens
  const std::string output = args.get("output");
  check_output_dir(output);

  const auto start = std::chrono::steady_clock::now();
  for (const std::string& f : inputs) trainer.add_file(f);
  const auto counted = std::chrono::steady_clock::now();
  const TrainedBpe bpe = trainer.train();
  save_bpe_tokenizer(bpe, output);
  const auto done = std::chrono::steady_clock::now();

  auto seconds = [](auto a, auto b) { return std::chrono::duration<double>(b - a).count(); };
  const size_t vocab = bpe.tokens.size() + bpe.special_tokens.size();
  const double kb = double(trainer.bytes_seen()) / 1e3;
  std::printf("trained %zu tokens (%zu merges, %zu special) on %.2f %s, %zu distinct words, in %.2f s "
              "(counting %.2f s) -> %s\n",
              vocab, bpe.merges.size(), bpe.special_tokens.size(), kb < 1e3 ? kb : kb / 1e3, kb < 1e3 ? "KB" : "MB",
              trainer.word_counts().size(), seconds(start, done), seconds(start, counted), output.c_str());
  if (int64_t(vocab) < options.vocab_size)
    std::printf("note: fewer than the %lld tokens asked for: no pair occurs at least %lld times any more\n",
                (long long)options.vocab_size, (long long)std::max<int64_t>(options.min_frequency, 1));
  return 0;
}

}  // namespace fab
