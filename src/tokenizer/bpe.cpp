#include "tokenizer/bpe.h"

#include <algorithm>
#include <atomic>
#include <memory>

#include "core/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/unicode.h"

namespace fab::tok {
namespace {

// HF caches words shorter than 256 bytes (utils/cache.rs MAX_LENGTH); the capacity only changes
// speed, never ids, so ours is larger than HF's 10,000.
constexpr size_t k_cache_max_word = 256;
constexpr size_t k_cache_capacity = 1 << 16;

std::atomic<uint64_t> g_next_instance{1};

uint64_t mix(uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdULL;
  k ^= k >> 33;
  return k;
}

uint64_t pair_key(int32_t a, int32_t b) { return uint64_t(uint32_t(a)) << 32 | uint32_t(b); }

std::string byte_fallback_token(int byte) {
  static const char* hex = "0123456789ABCDEF";
  return std::string("<0x") + hex[byte >> 4] + hex[byte & 15] + ">";
}

}  // namespace

void MergeMap::reserve(size_t n) {
  size_t capacity = 16;
  while (capacity < 2 * n) capacity *= 2;
  slots_.assign(capacity, Entry{k_empty, 0, 0});
  mask_ = capacity - 1;
  size_ = 0;
}

void MergeMap::insert_or_assign(int32_t a, int32_t b, int32_t rank, int32_t new_id) {
  FAB_CHECK(2 * (size_ + 1) <= slots_.size(), "MergeMap::reserve was too small");
  uint64_t key = pair_key(a, b);
  for (uint64_t i = mix(key) & mask_;; i = (i + 1) & mask_) {
    Entry& slot = slots_[i];
    if (slot.key == k_empty) ++size_;
    if (slot.key == k_empty || slot.key == key) {
      slot = {key, rank, new_id};
      return;
    }
  }
}

const MergeMap::Entry* MergeMap::find(int32_t a, int32_t b) const {
  uint64_t key = pair_key(a, b);
  for (uint64_t i = mix(key) & mask_;; i = (i + 1) & mask_) {
    const Entry& slot = slots_[i];
    if (slot.key == key) return &slot;
    if (slot.key == k_empty) return nullptr;
  }
}

struct BpeModel::WordCache {
  std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> words;
};

BpeModel::BpeModel(Vocab vocab, const std::vector<std::pair<std::string, std::string>>& merges, BpeOptions options)
    : vocab_(std::move(vocab)), options_(std::move(options)), instance_(g_next_instance++) {
  int32_t max_id = -1;
  for (const auto& [token, id] : vocab_) {
    FAB_USER_CHECK(id >= 0, "model.vocab: token \"{}\" has negative id {}", token, id);
    max_id = std::max(max_id, id);
  }
  vocab_r_.assign(size_t(max_id + 1), std::string());
  for (const auto& [token, id] : vocab_) vocab_r_[id] = token;

  // Like HF's BpeBuilder::build: the merged token is a + b without b's continuing prefix; when a
  // pair is listed twice the later rank wins (collected into a map in order).
  const size_t prefix = options_.continuing_subword_prefix.size();
  merges_.reserve(merges.size());
  std::string merged;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [a, b] = merges[rank];
    auto a_id = token_to_id(a), b_id = token_to_id(b);
    FAB_USER_CHECK(a_id, "model.merges[{}]: token \"{}\" is not in the vocabulary", rank, a);
    FAB_USER_CHECK(b_id, "model.merges[{}]: token \"{}\" is not in the vocabulary", rank, b);
    merged.assign(a).append(b.substr(std::min(prefix, b.size())));
    auto merged_id = token_to_id(merged);
    FAB_USER_CHECK(merged_id, "model.merges[{}]: merged token \"{}\" is not in the vocabulary", rank, merged);
    merges_.insert_or_assign(*a_id, *b_id, int32_t(rank), *merged_id);
  }

  plain_ = options_.continuing_subword_prefix.empty() && options_.end_of_word_suffix.empty();
  if (options_.unk_token) unk_id_ = token_to_id(*options_.unk_token);
  for (int b = 0; b < 256; ++b) {
    byte_ids_[b] = token_to_id(byte_level_char(uint8_t(b))).value_or(-1);
    byte_fallback_ids_[b] = token_to_id(byte_fallback_token(b)).value_or(-1);
  }
}

std::optional<int32_t> BpeModel::token_to_id(std::string_view token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::id_to_token(int32_t id) const {
  if (id < 0 || size_t(id) >= vocab_r_.size() || vocab_r_[id].empty()) return nullptr;
  return &vocab_r_[id];
}

// One cache per model and thread, as HF's BPE_LOCAL_CACHE: no locks on the hot path.
BpeModel::WordCache& BpeModel::cache() const {
  thread_local std::unordered_map<uint64_t, std::unique_ptr<WordCache>> caches;
  auto it = caches.find(instance_);
  if (it != caches.end()) return *it->second;
  if (caches.size() >= 8) caches.clear();  // models that were destroyed leave entries behind
  return *caches.emplace(instance_, std::make_unique<WordCache>()).first->second;
}

void BpeModel::tokenize(const Words& words, std::vector<int32_t>& out) const {
  WordCache& cached = cache();
  for (std::string_view word : words.pieces) {
    auto hit = cached.words.find(word);
    if (hit != cached.words.end()) {
      out.insert(out.end(), hit->second.begin(), hit->second.end());
      continue;
    }
    size_t first = out.size();
    tokenize_word(word, words.byte_level, out);
    if (word.size() < k_cache_max_word && cached.words.size() < k_cache_capacity)
      cached.words.emplace(std::string(word), std::vector<int32_t>(out.begin() + first, out.end()));
  }
}

void BpeModel::tokenize_word(std::string_view word, bool byte_level, std::vector<int32_t>& out) const {
  thread_local std::string mapped;
  thread_local std::vector<int32_t> symbols;
  // The word spelled in the vocabulary's alphabet (byte-level words are mapped only when needed).
  auto spelled = [&]() -> std::string_view {
    if (!byte_level) return word;
    mapped.clear();
    byte_level_encode(word, mapped);
    return mapped;
  };
  if (options_.ignore_merges) {
    if (auto id = token_to_id(spelled())) {
      out.push_back(*id);
      return;
    }
  }
  symbols.clear();
  if (!(byte_level && plain_ && initial_symbols_from_bytes(word, symbols))) {
    symbols.clear();
    initial_symbols_from_chars(spelled(), symbols);
  }
  merge(symbols);
  out.insert(out.end(), symbols.begin(), symbols.end());
}

// Byte-level fast path: every byte is one symbol whose id is its character's. False when some
// byte's character is not in the vocabulary (then the general path decides unk / byte fallback).
bool BpeModel::initial_symbols_from_bytes(std::string_view raw, std::vector<int32_t>& symbols) const {
  for (char c : raw) {
    int32_t id = byte_ids_[static_cast<uint8_t>(c)];
    if (id < 0) return false;
    symbols.push_back(id);
  }
  return true;
}

// HF's BPE::merge_word: one symbol per character, with the continuing prefix / end suffix, and
// the unk / byte-fallback rules for characters missing from the vocabulary.
void BpeModel::initial_symbols_from_chars(std::string_view word, std::vector<int32_t>& symbols) const {
  thread_local std::string piece;
  std::optional<int32_t> pending_unk;
  size_t pos = 0;
  while (pos < word.size()) {
    size_t begin = pos;
    pos += utf8_length(static_cast<unsigned char>(word[pos]));
    piece.clear();
    if (begin > 0) piece += options_.continuing_subword_prefix;
    piece.append(word.substr(begin, pos - begin));
    if (pos >= word.size()) piece += options_.end_of_word_suffix;
    if (auto id = token_to_id(piece)) {
      if (pending_unk) symbols.push_back(*std::exchange(pending_unk, std::nullopt));
      symbols.push_back(*id);
      continue;
    }
    if (options_.byte_fallback &&
        std::all_of(piece.begin(), piece.end(), [&](char c) { return byte_fallback_ids_[uint8_t(c)] >= 0; })) {
      for (char c : piece) symbols.push_back(byte_fallback_ids_[uint8_t(c)]);  // a pending unk waits, as in HF
      continue;
    }
    if (!options_.unk_token) continue;  // HF drops the character
    FAB_USER_CHECK(unk_id_, "model.unk_token \"{}\" is not in the vocabulary", *options_.unk_token);
    if (pending_unk && !options_.fuse_unk) symbols.push_back(*pending_unk);
    pending_unk = *unk_id_;
  }
  if (pending_unk) symbols.push_back(*pending_unk);
}

// HF's Word::merge_all: a min-heap on (rank, position); entries whose pair has changed since they
// were queued are skipped.
void BpeModel::merge(std::vector<int32_t>& ids) const {
  const int32_t n = int32_t(ids.size());
  if (n < 2) return;
  struct Candidate {
    int32_t rank, pos, new_id;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  thread_local std::vector<Candidate> heap;  // std::push_heap with greater<>: a min-heap
  thread_local std::vector<int32_t> prev, next;
  auto push = [&](const MergeMap::Entry* m, int32_t pos) {
    if (!m) return;
    heap.push_back({m->rank, pos, m->new_id});
    std::push_heap(heap.begin(), heap.end(), std::greater<>());
  };
  heap.clear();
  prev.resize(n);
  next.resize(n);
  for (int32_t i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
    if (i + 1 < n) push(merges_.find(ids[i], ids[i + 1]), i);
  }
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<>());
    Candidate top = heap.back();
    heap.pop_back();
    int32_t right = next[top.pos];
    if (ids[top.pos] < 0 || right < 0) continue;
    const auto* m = merges_.find(ids[top.pos], ids[right]);
    if (!m || m->new_id != top.new_id) continue;  // stale
    ids[top.pos] = top.new_id;
    ids[right] = -1;
    next[top.pos] = next[right];
    if (next[right] >= 0) prev[next[right]] = top.pos;
    if (prev[top.pos] >= 0) push(merges_.find(ids[prev[top.pos]], ids[top.pos]), prev[top.pos]);
    if (next[top.pos] >= 0) push(merges_.find(ids[top.pos], ids[next[top.pos]]), top.pos);
  }
  ids.erase(std::remove(ids.begin(), ids.end(), -1), ids.end());
}

}  // namespace fab::tok
