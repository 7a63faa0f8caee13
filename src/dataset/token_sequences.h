#pragma once
// Preprocessed samples stored back to back: sequence i is [offsets[i], offsets[i + 1]) of tokens
// and labels (-100: no loss on that position). Each sequence is one sample, or, when packed
// (packing / neat_packing), several samples whose starts sample_offsets lists. In memory while
// being built, memory-mapped when read back from the cache file, the same type either way.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace fab {

struct TokenSequences {
  std::span<const int32_t> tokens, labels;
  std::span<const int64_t> offsets;  // size() + 1 entries, offsets[0] == 0
  // Packed: samples() + 1 entries, every sample's first token and then the end, a superset of
  // offsets. Empty when every sequence is a single sample.
  std::span<const int64_t> sample_offsets;
  std::shared_ptr<const void> storage;  // keeps the vectors or the mapping alive

  int64_t size() const { return offsets.empty() ? 0 : int64_t(offsets.size()) - 1; }
  int64_t length(int64_t i) const { return offsets[size_t(i) + 1] - offsets[size_t(i)]; }
  int64_t total_tokens() const { return int64_t(tokens.size()); }
  bool packed() const { return !sample_offsets.empty(); }
  int64_t samples() const { return packed() ? int64_t(sample_offsets.size()) - 1 : size(); }
  // Starts of the samples of sequence i, relative to its first token (one 0 when unpacked).
  std::vector<int64_t> sample_starts(int64_t i) const;
};

class TokenSequencesBuilder {
 public:
  // A sequence holding one sample.
  void add(const std::vector<int32_t>& ids, const std::vector<int32_t>& labels);
  // Appends a sample to the packed sequence being built (closed by end_sequence).
  void add_to_sequence(std::span<const int32_t> ids, std::span<const int32_t> labels);
  void end_sequence();
  int64_t size() const { return int64_t(offsets_.size()) - 1; }
  // The builder is empty afterwards. The result is packed when add_to_sequence was used.
  TokenSequences finish();

 private:
  std::vector<int32_t> tokens_, labels_;
  std::vector<int64_t> offsets_{0}, sample_offsets_;  // sample_offsets_: starts only
  bool packed_ = false;
};

// The cache file: "FABTOK02", sequence count, token count, packed sample count (0: not packed),
// then offsets (i64), sample offsets (i64, when packed), tokens and labels (i32),
// little-endian. Written atomically; read back memory-mapped and validated.
void save_token_sequences(const std::string& path, const TokenSequences& data);
TokenSequences load_token_sequences(const std::string& path);

}  // namespace fab
