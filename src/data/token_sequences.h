#pragma once
// Preprocessed samples stored back to back: sample i is [offsets[i], offsets[i + 1]) of tokens and
// labels (-100: no loss on that position). In memory while being built, memory-mapped when read
// back from the cache file, the same type either way.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace fab {

struct TokenSequences {
  std::span<const int32_t> tokens, labels;
  std::span<const int64_t> offsets;  // size() + 1 entries, offsets[0] == 0
  std::shared_ptr<const void> storage;  // keeps the vectors or the mapping alive

  int64_t size() const { return offsets.empty() ? 0 : int64_t(offsets.size()) - 1; }
  int64_t length(int64_t i) const { return offsets[size_t(i) + 1] - offsets[size_t(i)]; }
  int64_t total_tokens() const { return int64_t(tokens.size()); }
};

class TokenSequencesBuilder {
 public:
  void add(const std::vector<int32_t>& ids, const std::vector<int32_t>& labels);
  int64_t size() const { return int64_t(offsets_.size()) - 1; }
  TokenSequences finish();  // the builder is empty afterwards

 private:
  std::vector<int32_t> tokens_, labels_;
  std::vector<int64_t> offsets_{0};
};

// The cache file: "FABTOK01", sample count, token count, then offsets (i64), tokens and labels
// (i32), little-endian. Written atomically; read back memory-mapped and validated.
void save_token_sequences(const std::string& path, const TokenSequences& data);
TokenSequences load_token_sequences(const std::string& path);

}  // namespace fab
