#pragma once
// The BPE model of tokenizer.json (HF models/bpe/model.rs and word.rs): each word starts as one
// symbol per character (or per byte, byte-level), then the adjacent pair with the lowest merge
// rank is merged, leftmost first, until no pair has a merge. Results are cached per thread.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tokenizer/pretokenizer.h"

namespace fab::tok {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using Vocab = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

struct BpeOptions {
  std::optional<std::string> unk_token;
  std::string continuing_subword_prefix;  // put before every symbol but the first ("" = none)
  std::string end_of_word_suffix;         // put after the last symbol ("" = none)
  bool fuse_unk = false;                  // consecutive unknown characters become one unk
  bool byte_fallback = false;             // unknown characters become their <0xNN> byte tokens
  bool ignore_merges = false;             // a word that is itself in the vocab is one token
};

// Open-addressing map from a pair of symbol ids to (rank, merged id).
class MergeMap {
 public:
  struct Entry {
    uint64_t key;
    int32_t rank;
    int32_t new_id;
  };
  void reserve(size_t n);
  void insert_or_assign(int32_t a, int32_t b, int32_t rank, int32_t new_id);
  const Entry* find(int32_t a, int32_t b) const;

 private:
  static constexpr uint64_t k_empty = ~uint64_t(0);
  std::vector<Entry> slots_;
  uint64_t mask_ = 0;
  size_t size_ = 0;
};

class BpeModel {
 public:
  // Merges are in rank order. Throws fab::UserError when a merge names a token (or makes one)
  // that is not in the vocabulary.
  BpeModel(Vocab vocab, const std::vector<std::pair<std::string, std::string>>& merges, BpeOptions options);

  // Appends the ids of every word. Byte-level words are raw bytes, read through GPT-2's alphabet.
  void tokenize(const Words& words, std::vector<int32_t>& out) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  const std::string* id_to_token(int32_t id) const;
  size_t vocab_size() const { return vocab_.size(); }
  int32_t max_id() const { return int32_t(vocab_r_.size()) - 1; }

 private:
  struct WordCache;
  WordCache& cache() const;
  void tokenize_word(std::string_view word, bool byte_level, std::vector<int32_t>& out) const;
  bool initial_symbols_from_bytes(std::string_view raw, std::vector<int32_t>& symbols) const;
  void initial_symbols_from_chars(std::string_view word, std::vector<int32_t>& symbols) const;
  void merge(std::vector<int32_t>& symbols) const;

  Vocab vocab_;
  std::vector<std::string> vocab_r_;  // id -> token ("" for ids no token has)
  MergeMap merges_;
  BpeOptions options_;
  std::optional<int32_t> unk_id_;
  bool plain_ = true;               // no continuing prefix or end suffix: bytes map to symbols 1:1
  int32_t byte_ids_[256];           // id of each byte's byte-level character, or -1
  int32_t byte_fallback_ids_[256];  // id of "<0xNN>", or -1
  uint64_t instance_ = 0;           // key of this model's per-thread cache
};

}  // namespace fab::tok
