// The byte-level BPE trainer: merges against a brute-force recount, the files it writes loaded by
// fab::Tokenizer (exact round trips), determinism, and the errors of `fabrica tokenizer train`.
// tests/tokenizer/bpe_trainer_parity.py checks the same files against Hugging Face `tokenizers`.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "cli/tokenizer_train_command.h"
#include "core/error.h"
#include "dataset/template.h"
#include "dataset/tokenizer_encoder.h"
#include "tokenizer/bpe_trainer.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/tokenizer.h"

namespace fab {
namespace {
namespace fs = std::filesystem;

// A few KB of mixed text: English prose, code, numbers, Chinese, accents, emoji, special tokens.
std::string corpus() {
  const std::string base = R"(The quick brown fox jumps over the lazy dog. The dog sleeps; the fox runs away.
Tokenizers split text into words, then merge the most frequent pairs of symbols into new tokens.
It's what they've done since GPT-2: we'll see that they're fast, and I'd say it's simple.
def train(words, vocab_size):
    for step in range(vocab_size - 256):
        pair = max(counts, key=counts.get)
        words = merge(words, pair)
    return words
Numbers: 1234567890, 3.14159, 2024-06-01, $42.00 and 100%.
机器学习是人工智能的一个分支。深度学习使用神经网络来学习数据的表示。
我们今天训练一个分词器，明天训练一个语言模型。
Café, naïve, résumé, Straße, Ελληνικά, русский текст, 日本語のテキスト, 한국어 문장.
Emoji: 🙂🚀✨ and symbols → ∑ ∞ ≠ ≤ ≥.
<|im_start|>user
What is the capital of France?<|im_end|>
<|im_start|>assistant
The capital of France is Paris.<|im_end|><|endoftext|>
    indented   text	with	tabs
and CRLF line endings
)";
  std::string text;
  for (int i = 0; i < 4; ++i) text += base;
  return text;
}

BpeTrainerOptions options(int64_t vocab_size, int64_t min_frequency = 2) {
  BpeTrainerOptions o;
  o.vocab_size = vocab_size;
  o.min_frequency = min_frequency;
  return o;
}

TrainedBpe train_on(const std::string& text, const BpeTrainerOptions& o) {
  BpeTrainer trainer(o);
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) trainer.add_text(line + "\n");
  return trainer.train();
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& tag)
      : path(fs::temp_directory_path() / ("fab_bpe_test_" + tag + "_" + std::to_string(::getpid()))) {
    fs::remove_all(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

// Brute force: recount every pair over every word at each step; the most frequent wins, ties to
// the smallest (left bytes, right bytes), which is std::map's first among the maxima.
std::vector<std::pair<std::string, std::string>> reference_merges(const WordCounts& words, int64_t min_frequency) {
  std::vector<std::pair<std::vector<std::string>, int64_t>> ws;
  for (const auto& [word, count] : words) {
    std::vector<std::string> symbols;
    for (char c : word) symbols.emplace_back(1, c);
    ws.emplace_back(symbols, count);
  }
  std::vector<std::pair<std::string, std::string>> merges;
  while (true) {
    std::map<std::pair<std::string, std::string>, int64_t> counts;
    for (const auto& [s, count] : ws)
      for (size_t i = 0; i + 1 < s.size(); ++i) counts[{s[i], s[i + 1]}] += count;
    auto best = counts.end();
    for (auto it = counts.begin(); it != counts.end(); ++it)
      if (best == counts.end() || it->second > best->second) best = it;
    if (best == counts.end() || best->second < min_frequency) return merges;
    const auto [a, b] = best->first;
    merges.emplace_back(a, b);
    for (auto& [s, count] : ws) {
      std::vector<std::string> out;
      for (size_t i = 0; i < s.size(); ++i) {
        if (i + 1 < s.size() && s[i] == a && s[i + 1] == b) {
          out.push_back(a + b);
          ++i;
        } else {
          out.push_back(s[i]);
        }
      }
      s = std::move(out);
    }
  }
}

TEST(BpeTrainer, FirstIdsAreTheBytesInGpt2Order) {
  const TrainedBpe bpe = train_on("hello", options(300));
  ASSERT_GE(bpe.tokens.size(), 256u);
  EXPECT_EQ(bpe.tokens[0], "!");
  EXPECT_EQ(tok::byte_level_char(uint8_t(bpe.tokens[255][0])), "\xC5\x83");  // Ń, the last of GPT-2's 256
  std::vector<int> seen;
  for (size_t i = 0; i < 256; ++i) {
    ASSERT_EQ(bpe.tokens[i].size(), 1u);
    seen.push_back(uint8_t(bpe.tokens[i][0]));
  }
  std::sort(seen.begin(), seen.end());
  for (int b = 0; b < 256; ++b) ASSERT_EQ(seen[size_t(b)], b);
}

TEST(BpeTrainer, MergesTheMostFrequentPairWithLexicographicTies) {
  // aaabdaaabac: (a,a) occurs 4 times; then (a,b) and (aa,a) both occur twice and (a,b) wins the
  // tie ("a" < "aa"); then (aa,ab) twice; everything else once, below min_frequency 2.
  const TrainedBpe bpe = train_on("aaabdaaabac", options(1000));
  ASSERT_EQ(bpe.merges.size(), 3u);
  auto merge_text = [&](size_t i) { return bpe.tokens[size_t(bpe.merges[i].first)] + " " + bpe.tokens[size_t(bpe.merges[i].second)]; };
  EXPECT_EQ(merge_text(0), "a a");
  EXPECT_EQ(merge_text(1), "a b");
  EXPECT_EQ(merge_text(2), "aa ab");
  EXPECT_EQ(bpe.merge_counts, (std::vector<int64_t>{4, 2, 2}));
  EXPECT_EQ(bpe.tokens.size(), 259u);
}

TEST(BpeTrainer, IncrementalCountsMatchABruteForceRecount) {
  BpeTrainer trainer(options(100000, 2));
  trainer.add_text(corpus());
  const TrainedBpe bpe = trainer.train();
  const auto expected = reference_merges(trainer.word_counts(), 2);
  ASSERT_GT(expected.size(), 200u);
  ASSERT_EQ(bpe.merges.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    const std::pair<std::string, std::string> got = {bpe.tokens[size_t(bpe.merges[i].first)],
                                                     bpe.tokens[size_t(bpe.merges[i].second)]};
    ASSERT_EQ(got, expected[i]) << "merge " << i;
  }
}

TEST(BpeTrainer, StopsAtTheVocabSizeAndSkipsSpecialTokenText) {
  BpeTrainer trainer(options(400));
  trainer.add_text(corpus());
  for (const auto& [word, count] : trainer.word_counts()) {
    ASSERT_EQ(word.find("<|im_"), std::string::npos) << word;
    ASSERT_EQ(word.find("endoftext"), std::string::npos) << word;
  }
  const TrainedBpe bpe = trainer.train();
  EXPECT_EQ(bpe.tokens.size() + bpe.special_tokens.size(), 400u);
  EXPECT_GE(bpe.merges.size(), 400u - 256u - 3u);  // more if two merges made the same token
}

TEST(BpeTrainer, TokenizerLoadsTheFilesAndRoundTrips) {
  TempDir dir("roundtrip");
  save_bpe_tokenizer(train_on(corpus(), options(600)), dir.path.string());
  const Tokenizer tokenizer = Tokenizer::load(dir.path.string());
  EXPECT_EQ(tokenizer.vocab_size(), 600);
  EXPECT_EQ(tokenizer.eos_id(), tokenizer.token_to_id("<|im_end|>"));
  EXPECT_EQ(tokenizer.pad_id(), tokenizer.token_to_id("<|endoftext|>"));
  EXPECT_EQ(tokenizer.token_to_id("<|im_start|>"), 598);
  EXPECT_FALSE(tokenizer.bos_id().has_value());
  EXPECT_FALSE(tokenizer.add_bos_token());

  const std::vector<std::string> texts = {
      "The quick brown fox jumps over the lazy dog.",
      "  leading and trailing spaces  ",
      "Tabs\tand\r\nCRLF\n\n\nnewlines",
      "机器学习和深度学习，以及从未见过的汉字：龘靐齉。",
      "Emoji 🙂🚀 and a flag 🇫🇷, combining e\u0301 (NFC makes it é)",
      "<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|><|endoftext|>",
      "def f(x):\n    return x ** 2  # 12345",
      "Zero-width\u200bjoiner and \xC2\xA0non-breaking space",
      "",
  };
  for (const std::string& text : texts) {
    const std::vector<int32_t> ids = tokenizer.encode(text, false);
    std::string expected = text;
    if (text.find("e\u0301") != std::string::npos) expected.replace(expected.find("e\u0301"), 3, "\u00e9");
    EXPECT_EQ(tokenizer.decode(ids), expected) << text;
  }
  // Special tokens are one id each; frequent words are merged.
  const std::vector<int32_t> chat = tokenizer.encode("<|im_start|>user<|im_end|>", false);
  ASSERT_GE(chat.size(), 3u);
  EXPECT_EQ(chat.front(), tokenizer.token_to_id("<|im_start|>"));
  EXPECT_EQ(chat.back(), tokenizer.token_to_id("<|im_end|>"));
  EXPECT_EQ(tokenizer.decode(chat, true), "user");
  EXPECT_EQ(tokenizer.encode(" the", false).size(), 1u);
}

// LLaMA-Factory's ChatML templates find every token they need, and <|im_end|> ends the answer.
TEST(BpeTrainer, QwenChatTemplatesWork) {
  TempDir dir("template");
  save_bpe_tokenizer(train_on(corpus(), options(600)), dir.path.string());
  const Tokenizer tokenizer = Tokenizer::load(dir.path.string());
  const TokenizerEncoder encoder(tokenizer);
  for (const char* name : {"qwen", "qwen3_nothink", "chatml"}) {
    const ChatTemplate chat(get_template(name), encoder);
    EXPECT_EQ(chat.eos_id(), tokenizer.token_to_id("<|im_end|>")) << name;
    EXPECT_TRUE(chat.missing_stop_words().empty()) << name;
    const auto turns = chat.encode_multiturn({{Role::user, "Hi"}, {Role::assistant, "Hello"}}, "", "");
    ASSERT_EQ(turns.size(), 1u);
    EXPECT_NE(tokenizer.decode(turns[0].first).find("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"),
              std::string::npos)
        << name;
    EXPECT_EQ(tokenizer.decode(turns[0].second).rfind("Hello<|im_end|>", 0), 0u) << name;
  }
}

TEST(BpeTrainer, TrainingIsDeterministic) {
  TempDir a("det_a"), b("det_b");
  save_bpe_tokenizer(train_on(corpus(), options(500)), a.path.string());
  // The same lines in reverse order: the same word counts, so the same model.
  std::vector<std::string> lines;
  std::istringstream in(corpus());
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  BpeTrainer reversed(options(500));
  for (auto it = lines.rbegin(); it != lines.rend(); ++it) reversed.add_text(*it + "\n");
  save_bpe_tokenizer(reversed.train(), b.path.string());
  for (const char* name : {"tokenizer.json", "tokenizer_config.json"}) {
    const std::string first = read_file(a.path / name);
    ASSERT_FALSE(first.empty()) << name;
    EXPECT_EQ(first, read_file(b.path / name)) << name;
  }
  EXPECT_FALSE(fs::exists(a.path / "tokenizer.json.tmp"));
}

TEST(BpeTrainer, RejectsBadOptions) {
  EXPECT_THROW(BpeTrainer(options(258)), UserError);  // 256 bytes + 3 special tokens > 258
  EXPECT_NO_THROW(BpeTrainer(options(259)));
  BpeTrainerOptions twice = options(1000);
  twice.special_tokens = {"<|a|>", "<|a|>"};
  EXPECT_THROW(BpeTrainer{twice}, UserError);
  BpeTrainerOptions empty = options(1000);
  empty.special_tokens = {""};
  EXPECT_THROW(BpeTrainer{empty}, UserError);
}

// Runs `fabrica tokenizer train ARGS...` in-process.
int run_cli(std::vector<std::string> args) {
  args.insert(args.begin(), {"fabrica", "tokenizer", "train"});
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  return run_tokenizer_train(int(argv.size()), argv.data());
}

TEST(BpeTrainer, CommandTrainsAndWritesNothingOnBadInput) {
  TempDir dir("cli");
  fs::create_directories(dir.path);
  const std::string input = (dir.path / "a.txt").string(), input2 = (dir.path / "b.txt").string();
  std::ofstream(input) << corpus();
  std::ofstream(input2) << "a second file\n";
  const std::string out = (dir.path / "out").string();

  EXPECT_THROW(run_cli({"--input", input + ",missing.txt", "--vocab-size", "500", "--output", out}), UserError);
  EXPECT_THROW(run_cli({"--input", input, "--vocab-size", "100", "--output", out}), UserError);
  EXPECT_THROW(run_cli({"--input", input, "--vocab-size", "5e2.5", "--output", out}), UserError);
  EXPECT_THROW(run_cli({"--input", input, "--output", out}), UserError);
  EXPECT_THROW(run_cli({"--input", input, "--vocab-size", "500", "--output", input + "/sub"}), UserError);
  EXPECT_FALSE(fs::exists(out));
  check_output_dir((dir.path / "x" / "y").string());  // the write probe leaves nothing behind
  EXPECT_FALSE(fs::exists(dir.path / "x"));

  ASSERT_EQ(run_cli({"--input", input + "," + input2, "--vocab-size", "500", "--output", out, "--special-tokens",
                     "<|endoftext|>,<|pad|>"}),
            0);
  const Tokenizer tokenizer = Tokenizer::load(out);
  EXPECT_EQ(tokenizer.vocab_size(), 500);
  EXPECT_EQ(tokenizer.token_to_id("<|pad|>"), 499);
  EXPECT_EQ(tokenizer.eos_id(), tokenizer.token_to_id("<|endoftext|>"));  // no <|im_end|>: the first one
}

}  // namespace
}  // namespace fab
