// Tokenizer pieces on small inline tokenizer.json files: they run everywhere, without the Python
// fixtures or the shared Qwen3 / Llama-3 files (tokenizer_parity_test.cpp checks those).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/regex.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace fab {
namespace {

// A byte-level BPE (byte b has id b) with merges a b -> ab, ab c -> abc, Ġ a -> Ġa, and "bca",
// which no merge makes.
std::string toy_json(const std::string& model_extra = "", const std::string& added = "[]",
                     const std::string& pre_tokenizer = R"({"type": "ByteLevel", "add_prefix_space": false,
                         "trim_offsets": false, "use_regex": true})",
                     const std::string& post = "null") {
  std::string vocab;
  for (int b = 0; b < 256; ++b) {
    std::string token(tok::byte_level_char(uint8_t(b)));
    if (token == "\"" || token == "\\") token = "\\" + token;
    vocab += "\"" + token + "\": " + std::to_string(b) + ", ";
  }
  vocab += R"("ab": 256, "abc": 257, "Ġa": 258, "<s>": 259, "bca": 260)";
  return R"({"version": "1.0", "added_tokens": )" + added + R"(, "normalizer": null, "pre_tokenizer": )" +
         pre_tokenizer + R"(, "post_processor": )" + post +
         R"(, "decoder": {"type": "ByteLevel"}, "model": {"type": "BPE", "vocab": {)" + vocab +
         R"(}, "merges": ["a b", ["ab", "c"], "Ġ a"])" + model_extra + "}}";
}

std::vector<int32_t> ids(std::initializer_list<int32_t> list) { return list; }

void replace_once(std::string& text, const std::string& from, const std::string& to) {
  size_t at = text.find(from);
  ASSERT_NE(at, std::string::npos) << from;
  text.replace(at, from.size(), to);
}

TEST(Tokenizer, ByteLevelAlphabetIsGpt2s) {
  EXPECT_EQ(tok::byte_level_char(' '), "\xC4\xA0");  // Ġ
  EXPECT_EQ(tok::byte_level_char('\n'), "\xC4\x8A");  // Ċ
  EXPECT_EQ(tok::byte_level_char('A'), "A");
  EXPECT_EQ(tok::byte_level_char(0xAD), "\xC5\x83");  // soft hyphen -> Ń (U+0143)
  for (int b = 0; b < 256; ++b) {
    std::string decoded;
    tok::byte_level_decode_token(tok::byte_level_char(uint8_t(b)), decoded);
    ASSERT_EQ(decoded, std::string(1, char(b)));
  }
}

TEST(Tokenizer, RepairsInvalidUtf8LikePython) {
  std::string repaired;
  EXPECT_EQ(tok::valid_utf8("plain", repaired), "plain");
  // Each maximal invalid subpart is one U+FFFD: a truncated 3-byte sequence, a lone continuation
  // byte, an overlong encoding (C0 80 -> two), a surrogate (ED A0 80 -> three).
  EXPECT_EQ(tok::utf8_lossy("a\xE4\xBD" "b"), "a\xEF\xBF\xBD" "b");
  EXPECT_EQ(tok::utf8_lossy("\x80"), "\xEF\xBF\xBD");
  EXPECT_EQ(tok::utf8_lossy("\xC0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(tok::utf8_lossy("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(tok::utf8_lossy("\xF0\x9F\x98\x80"), "\xF0\x9F\x98\x80");
}

TEST(Tokenizer, RegexRewriteMatchesOniguruma) {
  // \s without U+180E, with U+0085; \p{L} including letters newer than PCRE2's Unicode tables.
  tok::Regex space("\\s+", false);
  std::vector<tok::Span> found;
  space.find_all("a\xE1\xA0\x8E" "b\xC2\x85" "c", found);  // U+180E, U+0085
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].begin, 5u);
  found.clear();
  tok::Regex letters("[^\\s\\p{L}]+", false);
  letters.find_all("\xE1\xB2\x89", found);  // U+1C89, a letter since Unicode 16
  EXPECT_TRUE(found.empty());
  tok::Regex word("\\p{L}+|[x\\p{N}]+", false);  // outside and inside a class
  word.find_all("a\xE1\xB2\x89" "b \xF0\x90\xB5\x80" "x1", found);  // a U+1C89 b, then U+10D40 x 1
  ASSERT_EQ(found.size(), 2u);
  EXPECT_EQ(found[0].end, 5u);
  EXPECT_EQ(found[1].begin, 6u);
  EXPECT_EQ(found[1].end, 12u);
  found.clear();
  EXPECT_EQ(tok::onig_compatible_pattern("[\\]\\s]\\Q\\s\\E"), "[\\]" + std::string("\\t-\\r\\x20\\x{85}\\x{a0}"
                                         "\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}]\\Q\\s\\E"));
}

// A pattern from tokenizer.json that backtracks exponentially is the file's fault (a UserError).
TEST(Tokenizer, ExplodingRegexIsAUserError) {
  tok::Regex exploding("(a+)+$", false);
  std::vector<tok::Span> found;
  try {
    exploding.find_all(std::string(40, 'a') + "b", found);
    FAIL() << "matched without hitting PCRE2's limit";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("match limit exceeded"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("(a+)+$"), std::string::npos) << e.what();
  }
}

TEST(Tokenizer, EmptyMatchesAdvanceLikeOnig) {
  tok::Regex lookahead("(?=x)", false);
  std::vector<tok::Span> found;
  lookahead.find_all("axbx", found);
  ASSERT_EQ(found.size(), 2u);
  EXPECT_EQ(found[0].begin, 1u);
  EXPECT_EQ(found[1].begin, 3u);
}

TEST(Tokenizer, MergesByRankLeftmostFirst) {
  Tokenizer t = Tokenizer::from_json(toy_json());
  EXPECT_EQ(t.encode("abc"), ids({257}));
  EXPECT_EQ(t.encode("abab"), ids({256, 256}));
  EXPECT_EQ(t.encode("ab abc"), ids({256, ' ', 257}));  // a b (rank 0) beats Ġ a (rank 2)
  EXPECT_EQ(t.decode(t.encode("ab abc")), "ab abc");
  EXPECT_EQ(t.token_to_id("abc"), 257);
  EXPECT_EQ(t.token_to_id("missing"), -1);
  EXPECT_EQ(t.id_to_token(258), "Ġa");
  EXPECT_EQ(t.id_to_token(99999), "");
  EXPECT_EQ(t.vocab_size(), 261);
}

TEST(Tokenizer, IgnoreMergesTakesWholeWords) {
  Tokenizer plain = Tokenizer::from_json(toy_json());
  Tokenizer whole = Tokenizer::from_json(toy_json(R"(, "ignore_merges": true)"));
  EXPECT_EQ(plain.encode("bca"), ids({'b', 'c', 'a'}));
  EXPECT_EQ(whole.encode("bca"), ids({260}));
  EXPECT_EQ(whole.encode("abc bca"), ids({257, ' ', 'b', 'c', 'a'}));  // " bca" is not in the vocabulary
}

TEST(Tokenizer, AddedTokensSplitBeforeTheModel) {
  std::string added = R"([{"id": 259, "content": "<s>", "special": true, "normalized": false,
      "lstrip": false, "rstrip": false, "single_word": false},
    {"id": 260, "content": "<sep>", "special": false, "normalized": false, "lstrip": true, "rstrip": true,
      "single_word": false},
    {"id": 261, "content": "<s>x", "special": false, "normalized": false, "lstrip": false, "rstrip": false,
      "single_word": false},
    {"id": 262, "content": "cab", "special": false, "normalized": false, "lstrip": false, "rstrip": false,
      "single_word": true}])";
  Tokenizer t = Tokenizer::from_json(toy_json("", added));
  // As in HF, ids come from the vocabulary or count on from its size, whatever the file says.
  const int32_t sep = 261, s_x = 262, cab = 263;
  EXPECT_EQ(t.token_to_id("<sep>"), sep);
  EXPECT_EQ(t.encode("ab<s>ab"), ids({256, 259, 256}));
  EXPECT_EQ(t.encode("<s>xab"), ids({s_x, 256}));             // longest match
  EXPECT_EQ(t.encode("ab  <sep>  ab"), ids({256, sep, 256}));  // lstrip / rstrip eat the spaces
  EXPECT_EQ(t.encode("cab"), ids({cab}));
  EXPECT_EQ(t.encode("acab"), ids({'a', 'c', 256}));  // single_word: a word character before it
  EXPECT_EQ(t.decode({256, 259, 256}), "ab<s>ab");
  EXPECT_EQ(t.decode({256, 259, 256}, true), "abab");
  EXPECT_EQ(t.vocab_size(), 264);
}

TEST(Tokenizer, TemplateAddsSpecialTokens) {
  std::string post = R"({"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
      {"Sequence": {"id": "A", "type_id": 0}}], "pair": [], "special_tokens": {"<s>": {"id": "<s>", "ids": [259],
      "tokens": ["<s>"]}}})";
  Tokenizer t = Tokenizer::from_json(toy_json("", "[]", "null", post));
  EXPECT_EQ(t.encode("ab", true), ids({259, 256}));
  EXPECT_EQ(t.encode("ab", false), ids({256}));
}

TEST(Tokenizer, ByteFallbackAndUnknown) {
  std::string vocab = R"({"<unk>": 0, "a": 1, "b": 2, "ab": 3, "<0xC3>": 4, "<0xA9>": 5})";
  auto make = [&](const std::string& options) {
    return Tokenizer::from_json(R"({"model": {"type": "BPE", "vocab": )" + vocab +
                                R"(, "merges": [["a", "b"]], "unk_token": "<unk>")" + options +
                                R"(}, "decoder": {"type": "Sequence", "decoders": [{"type": "ByteFallback"},
                                {"type": "Fuse"}]}})");
  };
  Tokenizer fallback = make(R"(, "byte_fallback": true)");
  EXPECT_EQ(fallback.encode("ab\xC3\xA9"), ids({3, 4, 5}));  // é is two byte tokens
  EXPECT_EQ(fallback.decode({3, 4, 5}), "ab\xC3\xA9");
  EXPECT_EQ(fallback.decode({4}), "\xEF\xBF\xBD");
  EXPECT_EQ(fallback.encode("xya"), ids({0, 0, 1}));
  Tokenizer fused = make(R"(, "fuse_unk": true)");
  EXPECT_EQ(fused.encode("xyab"), ids({0, 3}));
}

TEST(Tokenizer, NormalizerAndInvalidInput) {
  std::string json = toy_json();
  replace_once(json, R"("normalizer": null)", R"("normalizer": {"type": "Sequence", "normalizers":
      [{"type": "NFC"}, {"type": "Replace", "pattern": {"String": "c"}, "content": "a"}]})");
  Tokenizer t = Tokenizer::from_json(json);
  EXPECT_EQ(t.encode("e\xCC\x81"), t.encode("\xC3\xA9"));  // e + U+0301 composes to é
  EXPECT_EQ(t.encode("cc"), t.encode("aa"));
  EXPECT_EQ(t.encode("a\xFF"), t.encode("a\xEF\xBF\xBD"));  // invalid bytes become U+FFFD
}

TEST(Tokenizer, ConcurrentEncodesAgree) {
  Tokenizer t = Tokenizer::from_json(toy_json());
  std::string text;
  for (int i = 0; i < 2000; ++i) text += (i % 3 ? "abc ab " : "ba cab\n");
  std::vector<int32_t> expected = t.encode(text);
  std::vector<std::thread> threads;
  std::vector<char> same(4);  // not vector<bool>: its bits share words across threads
  for (int k = 0; k < 4; ++k)
    threads.emplace_back([&, k] { same[k] = Tokenizer(t).encode(text) == expected; });
  for (auto& th : threads) th.join();
  for (int k = 0; k < 4; ++k) EXPECT_TRUE(bool(same[k])) << "thread " << k;
}

// ---- bad files: one UserError naming the file and the field ---------------------------------------

std::string load_error(const std::string& json) {
  try {
    Tokenizer::from_json(json, "bad/tokenizer.json");
  } catch (const UserError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Tokenizer, BadFilesGiveUserErrors) {
  auto expect_error = [](const std::string& json, const std::string& needle) {
    std::string message = load_error(json);
    EXPECT_NE(message.find("bad/tokenizer.json"), std::string::npos) << message;
    EXPECT_NE(message.find(needle), std::string::npos) << message;
  };
  expect_error("{", "not valid JSON");
  expect_error("[]", "expected a JSON object");
  expect_error(R"({"model": {"type": "WordPiece", "vocab": {}}})", "model.type: unsupported model type \"WordPiece\"");
  expect_error(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a b"]}})",
               "model.merges[0]: token \"b\" is not in the vocabulary");
  expect_error(R"({"model": {"type": "BPE", "vocab": {"a": "x"}, "merges": []}})", "model.vocab");
  expect_error(R"({"model": {"type": "BPE", "vocab": {}, "merges": ["a b c"]}})", "model.merges[0]");
  expect_error(R"({"model": {"type": "BPE", "vocab": {}}})", "model.merges: missing");
  expect_error(toy_json("", "[]", R"({"type": "WhitespaceSplit"})"),
               "pre_tokenizer.type: unsupported pre_tokenizer \"WhitespaceSplit\"");
  expect_error(toy_json("", "[]", R"({"type": "Metaspace", "replacement": "__"})"),
               "pre_tokenizer.replacement: expected one character");
  expect_error(toy_json("", "[]", R"({"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern":
      {"Regex": "(unclosed"}, "behavior": "Isolated", "invert": false}]})"), "pre_tokenizer.pretokenizers[0].pattern");
  expect_error(toy_json("", "[]", R"({"type": "Split", "pattern": {"Regex": "a"}, "behavior": "Sideways",
      "invert": false})"), "pre_tokenizer.behavior: unknown split behavior");
  expect_error(toy_json("", R"([{"id": 1}])"), "added_tokens[0].content: missing");
  expect_error(R"({"version": "2.0", "model": {}})", "unknown tokenizer version");
  expect_error(toy_json(R"(, "dropout": 0.1)"), "model.dropout");
  // The id -> token table is sized by the largest id (3e8 took 9.4 GB).
  expect_error(R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 2000000}, "merges": []}})",
               "model.vocab: token \"b\" has id 2000000, far beyond the vocabulary's 2 tokens");
}

TEST(Tokenizer, LoadReadsConfigBesideTheFile) {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / ("fab_tok_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "tokenizer.json") << toy_json();
  std::ofstream(dir / "tokenizer_config.json")
      << R"({"bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "abc", "pad_token": null})";
  Tokenizer from_dir = Tokenizer::load(dir.string());
  EXPECT_EQ(from_dir.bos_id(), 259);
  EXPECT_EQ(from_dir.eos_id(), 257);
  EXPECT_FALSE(from_dir.pad_id().has_value());
  EXPECT_EQ(Tokenizer::load((dir / "tokenizer.json").string()).eos_id(), 257);
  std::ofstream(dir / "tokenizer_config.json") << R"({"eos_token": "<nope>"})";
  try {
    Tokenizer::load(dir.string());
    ADD_FAILURE() << "expected a UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("eos_token: token \"<nope>\" is not in the vocabulary"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(Tokenizer::load((dir / "missing").string()), UserError);
  fs::remove_all(dir);
}

// ---- robustness: random input never crashes ------------------------------------------------------

TEST(TokenizerRobustness, RandomBytesRoundTrip) {
  Tokenizer t = Tokenizer::from_json(toy_json());
  std::mt19937 rng(42);
  const std::string alphabet[] = {"a", "b", "c", " ", "\n", "'s", "\xC3\xA9", "\xE4\xBD\xA0", "\xF0\x9F\x98\x80"};
  for (int i = 0; i < 2000; ++i) {
    std::string text;
    int n = int(rng() % 24);
    for (int k = 0; k < n; ++k) {
      if (rng() % 4 == 0) text += char(rng() % 256);  // anything, often invalid UTF-8
      else text += alphabet[rng() % std::size(alphabet)];
    }
    ASSERT_EQ(t.decode(t.encode(text)), tok::utf8_lossy(text)) << i;
  }
}

std::string damage(const std::string& json_text, std::mt19937& rng) {
  const char pieces[] = "{}[]\",:0-1.e tnfx\\";
  std::string json = json_text;
  for (int edits = 1 + int(rng() % 3); edits > 0; --edits) {
    size_t at = rng() % json.size();
    switch (rng() % 3) {
      case 0: json.erase(at, 1 + rng() % 8); break;
      case 1: json[at] = pieces[rng() % (sizeof(pieces) - 1)]; break;
      default: json.insert(at, 1, pieces[rng() % (sizeof(pieces) - 1)]);
    }
  }
  return json;
}

// Replaces one value (not in the vocabulary) by a value of another type, or removes it.
std::string retype(const nlohmann::json& doc, std::mt19937& rng) {
  nlohmann::json flat = doc.flatten();
  std::vector<std::string> paths;
  for (const auto& [path, value] : flat.items())
    if (path.rfind("/model/vocab/", 0) != 0) paths.push_back(path);
  nlohmann::json mutated = doc;
  const nlohmann::json replacements[] = {nullptr, -1, 0, 4000000000LL, 2.5, "", "x", "Isolated", true,
                                         nlohmann::json::array(), nlohmann::json::object(), {1, 2}};
  for (int edits = 1 + int(rng() % 2); edits > 0; --edits) {
    nlohmann::json::json_pointer path(paths[rng() % paths.size()]);
    if (rng() % 3 == 0) path = path.parent_pointer();  // sometimes the enclosing object or array
    if (path.empty() || !mutated.contains(path)) continue;
    if (rng() % 4 == 0) {
      nlohmann::json& parent = mutated[path.parent_pointer()];
      if (parent.is_object()) parent.erase(path.back());
      else parent.erase(std::stoul(path.back()));
    } else {
      mutated[path] = replacements[rng() % std::size(replacements)];
    }
  }
  return mutated.dump();
}

TEST(TokenizerRobustness, DamagedFilesFailWithUserErrors) {
  std::string post = R"({"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
      {"Sequence": {"id": "A", "type_id": 0}}], "pair": [], "special_tokens": {"<s>": {"id": "<s>", "ids": [259],
      "tokens": ["<s>"]}}})";
  std::string pre = R"({"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": "\\s+"},
      "behavior": "Isolated", "invert": false}, {"type": "Digits", "individual_digits": true},
      {"type": "ByteLevel", "add_prefix_space": true, "use_regex": false}]})";
  std::string good = toy_json(R"(, "unk_token": "<s>", "byte_fallback": true)",
                              R"([{"id": 259, "content": "<s>", "special": true, "normalized": false,
                                  "lstrip": false, "rstrip": false, "single_word": false}])", pre, post);
  replace_once(good, R"("normalizer": null)", R"("normalizer": {"type": "Sequence", "normalizers":
      [{"type": "NFC"}, {"type": "Replace", "pattern": {"String": "c"}, "content": "a"}, {"type": "Strip",
      "strip_left": true, "strip_right": false}]})");
  replace_once(good, R"("decoder": {"type": "ByteLevel"})", R"("decoder": {"type": "Sequence", "decoders":
      [{"type": "ByteLevel"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]})");
  const nlohmann::json doc = nlohmann::json::parse(good);
  Tokenizer::from_json(good);  // the undamaged file loads
  std::mt19937 rng(7);
  int loaded = 0;
  for (int i = 0; i < 4000; ++i) {
    std::string json = i % 2 ? damage(good, rng) : retype(doc, rng);
    try {
      Tokenizer t = Tokenizer::from_json(json, "damaged.json");
      t.decode(t.encode("ab c\xFF<s> 12"));
      ++loaded;
    } catch (const UserError&) {
    } catch (const std::exception& e) {
      FAIL() << "not a UserError: " << e.what() << "\nfor: " << json.substr(0, 2000);
    }
  }
  EXPECT_GT(loaded, 0);
}

}  // namespace
}  // namespace fab
