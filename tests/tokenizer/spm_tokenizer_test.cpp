// SentencePiece tokenizer.model: id parity with the `sentencepiece` package on the fixture
// tests/tokenizer/spm_parity.py writes (build/reference/spm/ and spm_parity.json), the Llama-2 special
// token rules, loading by folder or file, with or without tokenizer_config.json, and damaged files.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include <unistd.h>

#include "core/error.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace fab {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

fs::path spm_dir() { return fs::path(test::reference_dir()) / "spm"; }

const json* fixture() {
  static const json doc = [] {
    std::ifstream in(fs::path(test::reference_dir()) / "spm_parity.json");
    return in ? json::parse(in) : json();
  }();
  return doc.is_null() ? nullptr : &doc;
}

#define REQUIRE_FIXTURE()                                                                                   \
  const json* doc = fixture();                                                                              \
  if (!doc || !fs::exists(spm_dir() / "tokenizer.model"))                                                   \
    GTEST_SKIP() << "no " << test::reference_dir() << "/spm_parity.json: run python3 tests/tokenizer/spm_parity.py " \
                 << test::reference_dir()

std::string show(const std::vector<int32_t>& ids) {
  std::string out = "[";
  for (size_t i = 0; i < ids.size() && i < 40; ++i) out += (i ? ", " : "") + std::to_string(ids[i]);
  return out + (ids.size() > 40 ? ", ...]" : "]");
}

// A scratch folder, removed at the end of the test.
struct TempDir {
  fs::path path = fs::temp_directory_path() / ("fab_spm_test_" + std::to_string(::getpid()));
  TempDir() { fs::create_directories(path); }
  ~TempDir() { fs::remove_all(path); }
};

std::string read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

void write_bytes(const fs::path& path, std::string_view bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
}

TEST(SpmTokenizer, MatchesSentencePiece) {
  REQUIRE_FIXTURE();
  const Tokenizer tok = Tokenizer::load(spm_dir().string());
  const json& texts = (*doc)["texts"];
  const int32_t bos = (*doc)["bos"];
  int mismatches = 0;
  auto report = [&](const std::string& what, const std::string& text, const std::string& got, const std::string& want) {
    if (++mismatches <= 5)
      ADD_FAILURE() << what << " differs for " << json(text).dump() << "\n  fabrica:       " << got
                    << "\n  sentencepiece: " << want;
  };
  for (size_t i = 0; i < texts.size(); ++i) {
    const std::string text = texts[i];
    const json& want = (*doc)["results"][i];
    const auto want_ids = want["ids"].get<std::vector<int32_t>>();
    const auto ids = tok.encode(text);
    if (ids != want_ids) report("encode", text, show(ids), show(want_ids));
    std::vector<int32_t> want_special = want_ids;
    want_special.insert(want_special.begin(), bos);
    if (tok.encode(text, true) != want_special) report("encode(add_special_tokens)", text, show(tok.encode(text, true)), show(want_special));
    if (want["decoded_skip"].is_string() && tok.decode(want_ids, true) != want["decoded_skip"])
      report("decode(skip_special_tokens)", text, json(tok.decode(want_ids, true)).dump(), want["decoded_skip"].dump());
  }
  EXPECT_EQ(mismatches, 0) << mismatches << " mismatches over " << texts.size() << " texts";
  std::printf("[ PARITY   ] spm (sentencepiece %s): %zu texts, %d mismatches\n",
              (*doc)["sentencepiece_version"].get<std::string>().c_str(), texts.size(), mismatches);

  const json& pieces = (*doc)["pieces"];
  for (size_t id = 0; id < pieces.size(); ++id) {
    ASSERT_EQ(tok.token_to_id(pieces[id].get<std::string>()), int32_t(id)) << pieces[id];
    ASSERT_EQ(tok.id_to_token(int32_t(id)), pieces[id].get<std::string>());
  }
  EXPECT_EQ(tok.vocab_size(), (*doc)["vocab_size"].get<int64_t>());
  EXPECT_EQ(tok.bos_id(), bos);
  EXPECT_EQ(tok.eos_id(), (*doc)["eos"].get<int32_t>());
  EXPECT_EQ(tok.pad_id(), tok.token_to_id("<pad>"));
  EXPECT_TRUE(tok.add_bos_token());
}

// Llama-2's rules: special and added tokens written in the text are one id each, byte fallback
// pieces decode to UTF-8, the dummy prefix space goes away in decode.
TEST(SpmTokenizer, Llama2SpecialTokensAndBytes) {
  REQUIRE_FIXTURE();
  const Tokenizer tok = Tokenizer::load((spm_dir() / "tokenizer.model").string());  // config beside it
  const int32_t bos = *tok.bos_id(), eos = *tok.eos_id(), pad = *tok.pad_id();
  EXPECT_EQ(tok.id_to_token(bos), "<s>");
  EXPECT_EQ(tok.id_to_token(eos), "</s>");
  EXPECT_EQ(pad, 8000);
  const int32_t tool_call = tok.token_to_id("<tool_call>");
  EXPECT_EQ(tool_call, 8001);

  std::vector<int32_t> hello = tok.encode("Hello");
  std::vector<int32_t> ids = tok.encode("<s>Hello</s><pad><tool_call>");
  std::vector<int32_t> want = {bos};
  want.insert(want.end(), hello.begin(), hello.end());
  want.insert(want.end(), {eos, pad, tool_call});
  EXPECT_EQ(ids, want);
  EXPECT_EQ(tok.decode(ids), "<s> Hello</s><pad><tool_call>");
  EXPECT_EQ(tok.decode(ids, true), "Hello<tool_call>");
  EXPECT_EQ(tok.decode(tok.encode("Hello world", true), true), "Hello world");

  const std::string emoji = "\xF0\x9F\xA6\x99 \xE4\xBD\xA0\xE5\xA5\xBD";  // 🦙 你好
  ids = tok.encode(emoji);
  bool has_byte_piece = false;
  for (int32_t id : ids) has_byte_piece |= tok.id_to_token(id).rfind("<0x", 0) == 0;
  EXPECT_TRUE(has_byte_piece) << show(ids);
  EXPECT_EQ(tok.decode(ids), emoji);
  EXPECT_EQ(tok.decode({tok.token_to_id("<0xE4>")}), "\xEF\xBF\xBD");  // a lone lead byte
  EXPECT_EQ(tok.encode("\xFF"), tok.encode("\xEF\xBF\xBD"));            // invalid UTF-8 repaired first
  EXPECT_EQ(tok.token_to_id("no such piece"), -1);
  EXPECT_EQ(tok.id_to_token(int32_t(tok.vocab_size())), "");
}

// A bare tokenizer.model (no tokenizer_config.json): the model's <s>, </s>, <unk> are the
// special tokens, bos goes in front, and the config's added tokens are not there.
TEST(SpmTokenizer, BareModelFileUsesTheModelsSpecialTokens) {
  REQUIRE_FIXTURE();
  TempDir dir;
  fs::copy_file(spm_dir() / "tokenizer.model", dir.path / "tokenizer.model");
  const Tokenizer tok = Tokenizer::load(dir.path.string());
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_EQ(tok.eos_id(), 2);
  EXPECT_FALSE(tok.pad_id().has_value());
  EXPECT_EQ(tok.vocab_size(), 8000);
  EXPECT_EQ(tok.token_to_id("<pad>"), -1);
  const std::vector<int32_t> hello = tok.encode("Hello");
  std::vector<int32_t> want = {1, 0};
  want.insert(want.end(), hello.begin(), hello.end());
  want.push_back(2);
  EXPECT_EQ(tok.encode("<s><unk>Hello</s>"), want);
  EXPECT_EQ(tok.encode("Hello", true).front(), 1);
  EXPECT_TRUE(tok.add_bos_token());
  EXPECT_EQ(tok.source(), (dir.path / "tokenizer.model").string());

  std::ofstream(dir.path / "tokenizer_config.json") << R"({"add_bos_token": false, "add_eos_token": true})";
  const Tokenizer eos_only = Tokenizer::load((dir.path / "tokenizer.model").string());
  want = hello;
  want.push_back(2);
  EXPECT_EQ(eos_only.encode("Hello", true), want);
  EXPECT_FALSE(eos_only.add_bos_token());
}

std::string load_error(const fs::path& path) {
  try {
    Tokenizer::load(path.string());
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

// Missing, empty, garbage, truncated and corrupted .model files: a UserError naming the file
// (or, for a truncation that still parses, a tokenizer that works), never a crash.
TEST(SpmTokenizer, DamagedModelFilesFailWithUserErrors) {
  REQUIRE_FIXTURE();
  TempDir dir;
  const fs::path model = dir.path / "tokenizer.model";
  EXPECT_NE(load_error(model).find(model.string()), std::string::npos);
  EXPECT_NE(load_error(dir.path).find("no tokenizer.json or tokenizer.model"), std::string::npos);

  const std::string good = read_bytes(spm_dir() / "tokenizer.model");
  std::mt19937 rng(7);
  std::vector<std::string> damaged = {"", "not a model", std::string(1000, '\xFF')};
  for (size_t length : {size_t(1), size_t(2), size_t(7), size_t(100), good.size() / 3, good.size() / 2, good.size() - 1})
    damaged.push_back(good.substr(0, length));
  for (int i = 0; i < 40; ++i) damaged.push_back(good.substr(0, rng() % good.size()));
  for (int i = 0; i < 40; ++i) {
    std::string garbage(rng() % 4096, '\0');
    for (char& c : garbage) c = char(rng());
    damaged.push_back(garbage);
  }
  for (int i = 0; i < 40; ++i) {
    std::string flipped = good;
    for (int k = 0; k < 8; ++k) flipped[rng() % flipped.size()] = char(rng());
    damaged.push_back(flipped);
  }
  int rejected = 0;
  for (size_t i = 0; i < damaged.size(); ++i) {
    write_bytes(model, damaged[i]);
    const std::string error = load_error(model);
    if (error.empty()) {  // still a model: it must work
      const Tokenizer tok = Tokenizer::load(model.string());
      for (int32_t id : tok.encode("Hello <s> 你好 🦙 123", true)) EXPECT_LT(id, tok.vocab_size());
      continue;
    }
    ++rejected;
    EXPECT_NE(error.find(model.string()), std::string::npos) << error;
  }
  EXPECT_GE(rejected, 3 + 7 + 40);  // the garbage and every truncation in the middle of the pieces
  write_bytes(model, good.substr(0, good.size() / 2));
  EXPECT_NE(load_error(model).find("not a valid SentencePiece model"), std::string::npos) << load_error(model);
}

}  // namespace
}  // namespace fab
