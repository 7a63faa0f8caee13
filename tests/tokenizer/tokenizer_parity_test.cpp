// Id parity with Hugging Face `tokenizers` on the fixture tests/tokenizer/tokenizer_parity.py writes
// (build/reference/tokenizer_parity.json): every text through every tokenizer, encode with and
// without special tokens, decode with and without skipping them, plus vocabulary look-ups.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace fab {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// $FAB_SHARED_DIR, else the repository's ../shared (found from this file, or from the working
// directory: the repository root or its build folder).
fs::path shared_dir() {
  if (const char* dir = std::getenv("FAB_SHARED_DIR")) return dir;
  fs::path repo = fs::absolute(__FILE__).parent_path().parent_path().parent_path();
  for (const fs::path& candidate : {repo / "../shared", fs::path("../shared"), fs::path("../../shared")}) {
    std::error_code ec;
    if (fs::is_directory(candidate / "data", ec)) return candidate;
  }
  return repo / "../shared";
}

const json* fixture() {
  static const json doc = [] {
    fs::path path = fs::path(test::reference_dir()) / "tokenizer_parity.json";
    std::ifstream in(path);
    if (!in) return json();
    return json::parse(in);
  }();
  return doc.is_null() ? nullptr : &doc;
}

std::string show(const std::vector<int32_t>& ids) {
  std::string out = "[";
  for (size_t i = 0; i < ids.size() && i < 40; ++i) out += (i ? ", " : "") + std::to_string(ids[i]);
  return out + (ids.size() > 40 ? ", ...]" : "]");
}

struct Mismatches {
  int count = 0;
  void report(const std::string& what, const std::string& text, const std::string& got, const std::string& want) {
    if (++count <= 5)
      ADD_FAILURE() << what << " differs for " << json(text).dump() << "\n  fabrica: " << got << "\n  HF:      " << want;
  }
};

// Checks one tokenizer of the fixture; false (nothing checked) when its folder is not here.
bool check_tokenizer(const std::string& name, const json& ref, const json& texts) {
  fs::path root = ref["root"] == "shared" ? shared_dir() / "data" / "tokenizers" : fs::path(test::reference_dir());
  fs::path folder = root / ref["path"].get<std::string>();
  if (!fs::exists(folder / "tokenizer.json")) return false;
  Tokenizer tok = Tokenizer::load(folder.string());
  Mismatches bad;
  const json& results = ref["results"];
  for (size_t i = 0; i < texts.size(); ++i) {
    const std::string text = texts[i];
    const json& want = results[i];
    auto ids = tok.encode(text);
    auto want_ids = want["ids"].get<std::vector<int32_t>>();
    if (ids != want_ids) bad.report(name + " encode", text, show(ids), show(want_ids));
    auto with_special = tok.encode(text, true), want_special = want["ids_special"].get<std::vector<int32_t>>();
    if (with_special != want_special)
      bad.report(name + " encode(add_special_tokens)", text, show(with_special), show(want_special));
    std::string decoded = tok.decode(want_ids), decoded_skip = tok.decode(want_ids, true);
    if (decoded != want["decoded"]) bad.report(name + " decode", text, json(decoded).dump(), want["decoded"].dump());
    if (decoded_skip != want["decoded_skip"])
      bad.report(name + " decode(skip_special_tokens)", text, json(decoded_skip).dump(), want["decoded_skip"].dump());
  }
  EXPECT_EQ(bad.count, 0) << name << ": " << bad.count << " mismatches over " << texts.size() << " texts";

  const json& special = ref["special"];
  auto expect_special = [&](const char* key, std::optional<int32_t> got) {
    if (special[key].is_null()) EXPECT_FALSE(got.has_value()) << name << " " << key;
    else EXPECT_EQ(got, std::optional<int32_t>(special[key].get<int32_t>())) << name << " " << key;
  };
  expect_special("bos_token", tok.bos_id());
  expect_special("eos_token", tok.eos_id());
  expect_special("pad_token", tok.pad_id());
  EXPECT_EQ(tok.vocab_size(), ref["vocab_size"].get<int64_t>()) << name;
  for (const json& item : ref["vocab_sample"]) {
    EXPECT_EQ(tok.token_to_id(item[0].get<std::string>()), item[1].get<int32_t>()) << name << " " << item[0];
    EXPECT_EQ(tok.id_to_token(item[1].get<int32_t>()), item[2].get<std::string>()) << name << " " << item[0];
  }
  std::printf("[ PARITY   ] %s: %zu texts, %d mismatches\n", name.c_str(), texts.size(), bad.count);
  return true;
}

TEST(TokenizerParity, MatchesHuggingFace) {
  const json* doc = fixture();
  if (!doc)
    GTEST_SKIP() << "no " << test::reference_dir() << "/tokenizer_parity.json: run "
                 << "python3 tests/tokenizer/tokenizer_parity.py " << test::reference_dir();
  std::string missing;
  for (const auto& [name, ref] : (*doc)["tokenizers"].items())
    if (!check_tokenizer(name, ref, (*doc)["texts"])) missing += " " + name;
  // The tokenizers that were here are checked above; a missing one makes the test a skip, not a pass.
  if (!missing.empty()) GTEST_SKIP() << "tokenizer folders not found (is ../shared beside the checkout?):" << missing;
}

// Long inputs: deep BPE merges, long regex matches and the JIT stack, many cache misses.
TEST(TokenizerParity, LongInputsRoundTrip) {
  fs::path folder = shared_dir() / "data" / "tokenizers" / "llama3";
  if (!fs::exists(folder / "tokenizer.json")) GTEST_SKIP() << folder << " not found";
  Tokenizer tok = Tokenizer::load(folder.string());
  std::string texts[] = {std::string(200000, ' '), std::string(100000, 'a'), std::string(50000, '7'),
                         std::string(30000, '\n') + "x", std::string(20000, '!')};
  for (const std::string& text : texts) EXPECT_EQ(tok.decode(tok.encode(text)), text) << text.size();
}

void collect_strings(const json& value, std::vector<std::string>& out) {
  if (value.is_string()) {
    if (!value.get_ref<const std::string&>().empty()) out.push_back(value.get<std::string>());
  } else if (value.is_structured()) {
    for (const json& item : value) collect_strings(item, out);
  }
}

// The documents of tests/tokenizer/tokenizer_bench.py, which times HF on the same set.
std::vector<std::string> bench_documents(const fs::path& folder) {
  std::vector<std::string> docs;
  for (const char* name : {"alpaca_en_demo.json", "alpaca_zh_demo.json", "c4_demo.jsonl",
                           "glaive_toolcall_en_demo.json", "wiki_demo.txt"}) {
    std::ifstream in(folder / name);
    std::string line;
    if (std::string(name).ends_with(".json")) {
      collect_strings(json::parse(in), docs);
      continue;
    }
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      if (std::string(name).ends_with(".jsonl")) collect_strings(json::parse(line), docs);
      else docs.push_back(line);
    }
  }
  return docs;
}

// Single-thread encode throughput (compare with tokenizer_bench.py): not part of the suite.
TEST(TokenizerBench, DISABLED_Throughput) {
  fs::path data = shared_dir() / "data";
  if (!fs::exists(data / "llamafactory")) GTEST_SKIP() << data << " not found";
  std::vector<std::string> docs = bench_documents(data / "llamafactory");
  size_t bytes = 0;
  for (const auto& d : docs) bytes += d.size();
  std::printf("%zu documents, %.2f MB\n", docs.size(), bytes / 1e6);
  for (const char* name : {"qwen3", "llama3"}) {
    Tokenizer tok = Tokenizer::load((data / "tokenizers" / name).string());
    double best = 1e30, cold = 0;
    size_t count = 0;
    for (int run = 0; run < 3; ++run) {
      auto start = std::chrono::steady_clock::now();
      count = 0;
      std::vector<int32_t> ids;
      for (const auto& d : docs) {
        ids.clear();
        tok.encode_into(d, ids);
        count += ids.size();
      }
      double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (run == 0) cold = seconds;
      best = std::min(best, seconds);
    }
    std::printf("fabrica %-7s encode: %zu ids in %.3f s = %.2f M ids/s, %.2f MB/s (first run %.3f s)\n", name, count,
                best, count / best / 1e6, bytes / best / 1e6, cold);
  }
}

}  // namespace
}  // namespace fab
