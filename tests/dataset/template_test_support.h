#pragma once
// Shared by the dataset / template / preprocess tests: where the shared data and the fixtures are,
// fab::Tokenizer adapted to the TextEncoder interface, and a tiny fake encoder.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dataset/template.h"
#include "dataset/tokenizer_encoder.h"
#include "tokenizer/tokenizer.h"

namespace fab::test {

namespace fs = std::filesystem;

// tests/dataset/ in the source tree (this header's folder).
inline fs::path data_test_dir() { return fs::path(__FILE__).parent_path(); }

inline fs::path fixture_dir() { return data_test_dir() / "fixtures"; }

// Whether `dir` holds what these tests read: the LLaMA-Factory samples and both tokenizers.
inline bool has_shared_data(const fs::path& dir) {
  std::error_code ec;
  return fs::is_regular_file(dir / "data/llamafactory/dataset_info.json", ec) &&
         fs::is_regular_file(dir / "data/tokenizers/qwen3/tokenizer.json", ec) &&
         fs::is_regular_file(dir / "data/tokenizers/llama3/tokenizer.json", ec);
}

// FAB_SHARED_DIR, else "<repo>/../shared" (the repo found from this file, or from the working
// directory: the tests run from build/). Empty when the data is not there.
inline std::string shared_dir() {
  std::vector<fs::path> candidates;
  if (const char* dir = std::getenv("FAB_SHARED_DIR")) candidates = {dir};
  else candidates = {data_test_dir() / "../../../shared", fs::path("../shared"), fs::path("../../shared")};
  for (const fs::path& candidate : candidates)
    if (has_shared_data(candidate)) return fs::weakly_canonical(candidate).string();
  return "";
}

inline std::string llamafactory_dir() { return shared_dir() + "/data/llamafactory"; }

#define FAB_REQUIRE_SHARED_DATA()                                                                   \
  do {                                                                                              \
    if (::fab::test::shared_dir().empty())                                                          \
      GTEST_SKIP() << "shared data not found: set FAB_SHARED_DIR to the folder holding data/";     \
  } while (0)

inline nlohmann::json read_json_file(const fs::path& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

// A loaded tokenizer and its TextEncoder view (src/dataset/tokenizer_encoder.h).
struct LoadedTokenizer {
  explicit LoadedTokenizer(const std::string& folder) : tokenizer(Tokenizer::load(folder)) {}
  Tokenizer tokenizer;
  ::fab::TokenizerEncoder encoder{tokenizer};
};

// One loaded tokenizer per name ("qwen3", "llama3") for the whole test binary.
inline const LoadedTokenizer& shared_loaded_tokenizer(const std::string& name) {
  static std::map<std::string, std::unique_ptr<LoadedTokenizer>> cache;
  auto& slot = cache[name];
  if (!slot) slot = std::make_unique<LoadedTokenizer>(shared_dir() + "/data/tokenizers/" + name);
  return *slot;
}

inline const ::fab::TokenizerEncoder& shared_tokenizer(const std::string& name) {
  return shared_loaded_tokenizer(name).encoder;
}

// A fake tokenizer for unit tests: each byte is its own id (0..255), and the special tokens
// below are recognised whole (ids from 1000). No bos; eos "<eos>".
class FakeEncoder : public TextEncoder {
 public:
  FakeEncoder() {
    for (const char* t : {"<eos>", "<bos>", "<|im_start|>", "<|im_end|>", "<|eot_id|>", "<|eom_id|>",
                          "<|start_header_id|>", "<|end_header_id|>", "<|end_of_text|>"})
      specials_.emplace(t, 1000 + static_cast<int32_t>(specials_.size()));
  }
  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int32_t> ids;
    for (size_t i = 0; i < text.size();) {
      size_t matched = 0;
      for (const auto& [token, id] : specials_) {
        if (text.substr(i, token.size()) == token) {
          ids.push_back(id);
          matched = token.size();
          break;
        }
      }
      if (matched == 0) ids.push_back(static_cast<unsigned char>(text[i++]));
      i += matched;
    }
    return ids;
  }
  int32_t token_to_id(std::string_view token) const override {
    auto it = specials_.find(std::string(token));
    return it == specials_.end() ? -1 : it->second;
  }
  std::string id_to_token(int32_t id) const override {
    for (const auto& [token, i] : specials_)
      if (i == id) return token;
    return id < 256 ? std::string(1, static_cast<char>(id)) : "";
  }
  std::optional<int32_t> bos_id() const override { return bos_ ? std::optional<int32_t>(1001) : std::nullopt; }
  std::optional<int32_t> eos_id() const override { return 1000; }
  bool add_bos_token() const override { return bos_; }

  bool bos_ = false;

 private:
  std::map<std::string, int32_t> specials_;
};

// Expands the fixture's label run lengths (alternating masked / copied, first run masked).
inline std::vector<int32_t> labels_from_runs(const std::vector<int32_t>& ids, const nlohmann::json& runs) {
  std::vector<int32_t> labels;
  bool masked = true;
  for (const auto& run : runs) {
    for (int64_t i = 0; i < run.get<int64_t>(); ++i) {
      size_t at = labels.size();
      labels.push_back(masked || at >= ids.size() ? -100 : ids[at]);
    }
    masked = !masked;
  }
  return labels;
}

}  // namespace fab::test
