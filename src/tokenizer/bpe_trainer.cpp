#include "tokenizer/bpe_trainer.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_set>

#include "core/error.h"
#include "core/file_write.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/unicode.h"

namespace fab {
namespace fs = std::filesystem;

const char* const kQwen2SplitPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

std::vector<std::string> default_special_tokens() { return {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}; }

namespace {

// ---- counting words ----------------------------------------------------------------------------

// Calls `piece` on each stretch of `text` between special tokens. Matching is leftmost-longest on
// the raw text, as HF's added vocabulary does for normalized=false tokens, so the tokens' own
// text is never counted as words.
template <class Piece>
void for_each_ordinary_piece(std::string_view text, const std::vector<std::string>& specials, Piece&& piece) {
  size_t start = 0;
  while (start < text.size()) {
    size_t best = std::string_view::npos, best_length = 0;
    for (const std::string& s : specials) {
      const size_t at = text.find(s, start);
      if (at < best || (at == best && at != std::string_view::npos && s.size() > best_length)) {
        best = at;
        best_length = s.size();
      }
    }
    if (best == std::string_view::npos) break;
    if (best > start) piece(text.substr(start, best - start));
    start = best + best_length;
  }
  if (start < text.size()) piece(text.substr(start));
}

// ---- the merge loop ----------------------------------------------------------------------------

using Pair = uint64_t;  // (left id << 32) | right id
Pair make_pair_key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }
int32_t left_of(Pair p) { return int32_t(p >> 32); }
int32_t right_of(Pair p) { return int32_t(uint32_t(p)); }

// The 256 bytes in the order of their byte-level characters' code points: the printable ASCII and
// Latin-1 bytes first (they stand for themselves), then the 68 others (U+0100..). This is the
// order of GPT-2's and Qwen's first 256 ids.
std::array<uint8_t, 256> base_byte_order() {
  std::array<std::pair<char32_t, uint8_t>, 256> by_code_point;
  for (int b = 0; b < 256; ++b) {
    const std::string_view ch = tok::byte_level_char(uint8_t(b));
    size_t pos = 0;
    by_code_point[size_t(b)] = {tok::next_code_point(ch, pos), uint8_t(b)};
  }
  std::sort(by_code_point.begin(), by_code_point.end());
  std::array<uint8_t, 256> order{};
  for (size_t i = 0; i < 256; ++i) order[i] = by_code_point[i].second;
  return order;
}

// BPE training with incremental pair counts (the scheme of HF's BpeTrainer): every word is a list
// of symbol ids with a frequency; `counts_` holds the frequency of every adjacent pair over all
// words and `where_` the words each pair occurs in. Merging a pair rewrites only the words in
// where_[pair] and adjusts the counts of the pairs those words gain and lose. A max-heap of
// (count, pair) picks the next merge; entries are not updated in place: a popped entry whose
// count is out of date is pushed back with the current count, and a pair whose count grows gets
// a fresh entry, so the heap always holds an entry at least as high as each pair's count.
class MergeLoop {
 public:
  MergeLoop(const WordCounts& words, TrainedBpe& bpe);
  void run(size_t target_tokens, int64_t min_frequency);

 private:
  struct Entry {
    int64_t count;
    Pair pair;
  };
  // Heap order: higher count first; equal counts go to the pair whose left token's bytes sort
  // first, then the right token's bytes (byte-wise, as std::string compares).
  bool lower_priority(const Entry& x, const Entry& y) const {
    if (x.count != y.count) return x.count < y.count;
    const std::string& xl = bpe_.tokens[size_t(left_of(x.pair))];
    const std::string& yl = bpe_.tokens[size_t(left_of(y.pair))];
    if (xl != yl) return xl > yl;
    return bpe_.tokens[size_t(right_of(x.pair))] > bpe_.tokens[size_t(right_of(y.pair))];
  }
  void push(Entry e);
  Entry pop();
  bool makes_special_token(Pair pair) const;
  int32_t token_for(Pair pair);
  void merge(Pair pair, int64_t count);

  TrainedBpe& bpe_;
  std::vector<std::vector<int32_t>> symbols_;  // per word
  std::vector<int64_t> frequency_;             // per word
  std::unordered_map<Pair, int64_t> counts_;
  std::unordered_map<Pair, std::vector<uint32_t>> where_;  // word indices, may repeat
  std::unordered_map<std::string, int32_t> id_of_bytes_;
  std::unordered_set<std::string> special_bytes_;  // special tokens as byte-level strings
  std::vector<Entry> heap_;
  std::vector<std::pair<Pair, int64_t>> delta_;  // scratch of merge()
  std::vector<int32_t> scratch_;                 // scratch of merge()
};

MergeLoop::MergeLoop(const WordCounts& words, TrainedBpe& bpe) : bpe_(bpe) {
  std::array<int32_t, 256> id_of_byte{};
  for (size_t i = 0; i < 256; ++i) id_of_byte[bpe.tokens[i][0] & 0xFF] = int32_t(i);
  for (size_t i = 0; i < bpe.tokens.size(); ++i) id_of_bytes_[bpe.tokens[i]] = int32_t(i);
  for (const std::string& s : bpe.special_tokens) special_bytes_.insert(s);
  // Words in byte order, so that the result does not depend on hash-map iteration order.
  std::vector<std::pair<std::string_view, int64_t>> sorted;
  for (const auto& [word, count] : words)
    if (word.size() > 1) sorted.emplace_back(word, count);
  std::sort(sorted.begin(), sorted.end());
  for (const auto& [word, count] : sorted) {
    std::vector<int32_t> s;
    for (char c : word) s.push_back(id_of_byte[uint8_t(c)]);
    const uint32_t w = uint32_t(symbols_.size());
    for (size_t i = 0; i + 1 < s.size(); ++i) {
      const Pair p = make_pair_key(s[i], s[i + 1]);
      counts_[p] += count;
      where_[p].push_back(w);
    }
    symbols_.push_back(std::move(s));
    frequency_.push_back(count);
  }
  for (const auto& [pair, count] : counts_) push({count, pair});
}

void MergeLoop::push(Entry e) {
  heap_.push_back(e);
  std::push_heap(heap_.begin(), heap_.end(), [this](const Entry& x, const Entry& y) { return lower_priority(x, y); });
}

MergeLoop::Entry MergeLoop::pop() {
  std::pop_heap(heap_.begin(), heap_.end(), [this](const Entry& x, const Entry& y) { return lower_priority(x, y); });
  const Entry e = heap_.back();
  heap_.pop_back();
  return e;
}

// A merged token must not spell a special token: the added token and the model token would then
// share a content, and HF would give both the model's id.
bool MergeLoop::makes_special_token(Pair pair) const {
  if (special_bytes_.empty()) return false;
  std::string chars;
  tok::byte_level_encode(bpe_.tokens[size_t(left_of(pair))] + bpe_.tokens[size_t(right_of(pair))], chars);
  return special_bytes_.count(chars) != 0;
}

// The id of the merged token; a new one unless another merge already made the same bytes (as in
// HF, both merges then map to that one token).
int32_t MergeLoop::token_for(Pair pair) {
  std::string bytes = bpe_.tokens[size_t(left_of(pair))] + bpe_.tokens[size_t(right_of(pair))];
  auto [it, inserted] = id_of_bytes_.emplace(bytes, int32_t(bpe_.tokens.size()));
  if (inserted) bpe_.tokens.push_back(std::move(bytes));
  return it->second;
}

// Replaces every occurrence of `pair` (left to right, non-overlapping) in the words that hold it,
// and moves the pair counts by the difference between each word's pairs before and after.
void MergeLoop::merge(Pair pair, int64_t count) {
  const int32_t a = left_of(pair), b = right_of(pair), merged = token_for(pair);
  bpe_.merges.emplace_back(a, b);
  bpe_.merge_counts.push_back(count);
  std::vector<uint32_t> words = std::move(where_[pair]);
  where_.erase(pair);
  std::sort(words.begin(), words.end());
  words.erase(std::unique(words.begin(), words.end()), words.end());
  // Pairs with none of a, b, merged are the same before and after; only the others are diffed.
  auto touched = [&](int32_t x, int32_t y) { return x == a || x == b || x == merged || y == a || y == b || y == merged; };
  std::vector<std::pair<Pair, int64_t>>& delta = delta_;
  std::vector<int32_t>& out = scratch_;
  delta.clear();
  for (const uint32_t w : words) {
    std::vector<int32_t>& s = symbols_[w];
    const int64_t f = frequency_[w];
    out.clear();
    for (size_t i = 0; i < s.size(); ++i) {
      if (i + 1 < s.size() && s[i] == a && s[i + 1] == b) {
        out.push_back(merged);
        ++i;
      } else {
        out.push_back(s[i]);
      }
    }
    if (out.size() == s.size()) continue;  // a stale entry of where_: the pair is gone from w
    for (size_t i = 0; i + 1 < s.size(); ++i)
      if (touched(s[i], s[i + 1])) delta.emplace_back(make_pair_key(s[i], s[i + 1]), -f);
    for (size_t i = 0; i + 1 < out.size(); ++i) {
      if (!touched(out[i], out[i + 1])) continue;
      const Pair p = make_pair_key(out[i], out[i + 1]);
      delta.emplace_back(p, f);
      if (out[i] == merged || out[i + 1] == merged) where_[p].push_back(w);
    }
    s.swap(out);
  }
  // Sum the changes per pair, then apply them.
  std::sort(delta.begin(), delta.end());
  for (size_t i = 0; i < delta.size();) {
    const Pair p = delta[i].first;
    int64_t d = 0;
    for (; i < delta.size() && delta[i].first == p; ++i) d += delta[i].second;
    if (d == 0) continue;
    const int64_t now = counts_[p] += d;
    if (now <= 0) {
      counts_.erase(p);
      where_.erase(p);
    } else if (d > 0) {
      push({now, p});
    }
  }
}

void MergeLoop::run(size_t target_tokens, int64_t min_frequency) {
  while (bpe_.tokens.size() < target_tokens && !heap_.empty()) {
    const Entry top = pop();
    const auto it = counts_.find(top.pair);
    const int64_t now = it == counts_.end() ? 0 : it->second;
    if (now != top.count) {  // out of date: try again with the current count
      if (now > 0) push({now, top.pair});
      continue;
    }
    if (now < std::max<int64_t>(min_frequency, 1)) break;
    if (makes_special_token(top.pair)) continue;
    merge(top.pair, now);
  }
}

// ---- writing -----------------------------------------------------------------------------------

using ojson = nlohmann::ordered_json;

std::string chars_of(const std::string& bytes) {
  std::string out;
  tok::byte_level_encode(bytes, out);
  return out;
}

ojson byte_level_component() {
  return {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}};
}

ojson added_token_json(const std::string& content) {
  return {{"content", content}, {"single_word", false}, {"lstrip", false},
          {"rstrip", false},    {"normalized", false},  {"special", true}};
}

ojson bpe_model_json(const TrainedBpe& bpe) {
  ojson vocab = ojson::object();
  for (size_t i = 0; i < bpe.tokens.size(); ++i) vocab[chars_of(bpe.tokens[i])] = i;
  ojson merges = ojson::array();
  for (const auto& [a, b] : bpe.merges)
    merges.push_back({chars_of(bpe.tokens[size_t(a)]), chars_of(bpe.tokens[size_t(b)])});
  return {{"type", "BPE"},
          {"dropout", nullptr},
          {"unk_token", nullptr},
          {"continuing_subword_prefix", nullptr},
          {"end_of_word_suffix", nullptr},
          {"fuse_unk", false},
          {"byte_fallback", false},
          {"ignore_merges", false},
          {"vocab", std::move(vocab)},
          {"merges", std::move(merges)}};
}

bool has_token(const TrainedBpe& bpe, const std::string& token) {
  return std::find(bpe.special_tokens.begin(), bpe.special_tokens.end(), token) != bpe.special_tokens.end();
}

// ChatML, the format of Qwen's chat models (and of LLaMA-Factory's "qwen" template).
const char* const kChatMlTemplate =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

}  // namespace

// ---- BpeTrainer --------------------------------------------------------------------------------

BpeTrainer::BpeTrainer(BpeTrainerOptions options) : options_(std::move(options)), split_(kQwen2SplitPattern, false) {
  nfc_.add(tok::make_unicode_normalizer(tok::UnicodeForm::nfc));
  const auto& specials = options_.special_tokens;
  for (size_t i = 0; i < specials.size(); ++i) {
    std::string repaired;
    FAB_USER_CHECK(!specials[i].empty(), "special token {} is empty", i + 1);
    FAB_USER_CHECK(tok::valid_utf8(specials[i], repaired).data() == specials[i].data(),
                   "special token \"{}\" is not valid UTF-8", specials[i]);
    FAB_USER_CHECK(std::find(specials.begin(), specials.begin() + long(i), specials[i]) == specials.begin() + long(i),
                   "special token \"{}\" is given twice", specials[i]);
  }
  const int64_t least = 256 + int64_t(specials.size());
  FAB_USER_CHECK(options_.vocab_size >= least && options_.vocab_size <= (int64_t(1) << 31) - 1,
                 "vocab size {} must be at least {} (256 bytes + {} special tokens) and below 2^31",
                 options_.vocab_size, least, specials.size());
  FAB_USER_CHECK(options_.min_frequency >= 0, "min frequency must be >= 0, got {}", options_.min_frequency);
}

void BpeTrainer::count_words(std::string_view text) {
  std::string buffer;
  const std::string_view normalized = nfc_.run(text, buffer);
  std::vector<tok::Span> spans;
  split_.find_all(normalized, spans);
  // Split "Isolated": the matches and the text between them are all words.
  auto add = [&](size_t begin, size_t end) {
    if (end <= begin) return;
    const std::string_view word = normalized.substr(begin, end - begin);
    auto it = words_.find(word);
    if (it == words_.end()) it = words_.emplace(std::string(word), 0).first;
    ++it->second;
  };
  size_t previous = 0;
  for (const tok::Span& span : spans) {
    add(previous, span.begin);
    add(span.begin, span.end);
    previous = span.end;
  }
  add(previous, normalized.size());
}

void BpeTrainer::add_text(std::string_view text) {
  bytes_seen_ += int64_t(text.size());
  std::string repaired;
  const std::string_view valid = tok::valid_utf8(text, repaired);
  for_each_ordinary_piece(valid, options_.special_tokens, [this](std::string_view piece) { count_words(piece); });
}

void BpeTrainer::add_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  FAB_USER_CHECK(in, "{}: cannot open", path);
  std::ostringstream content;
  content << in.rdbuf();
  FAB_USER_CHECK(!in.bad(), "{}: read failed", path);
  const std::string text = std::move(content).str();
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    end = end == std::string::npos ? text.size() : end + 1;
    add_text(std::string_view(text).substr(start, end - start));
    start = end;
  }
}

TrainedBpe BpeTrainer::train() const {
  TrainedBpe bpe;
  bpe.special_tokens = options_.special_tokens;
  for (uint8_t b : base_byte_order()) bpe.tokens.emplace_back(1, char(b));
  MergeLoop loop(words_, bpe);
  loop.run(size_t(options_.vocab_size) - bpe.special_tokens.size(), options_.min_frequency);
  return bpe;
}

// ---- files -------------------------------------------------------------------------------------

std::string bpe_tokenizer_json(const TrainedBpe& bpe) {
  ojson added = ojson::array();
  for (size_t i = 0; i < bpe.special_tokens.size(); ++i) {
    ojson token = {{"id", bpe.tokens.size() + i}};
    token.update(added_token_json(bpe.special_tokens[i]));
    added.push_back(std::move(token));
  }
  ojson split = {{"type", "Split"},
                 {"pattern", {{"Regex", kQwen2SplitPattern}}},
                 {"behavior", "Isolated"},
                 {"invert", false}};
  ojson root = {{"version", "1.0"},
                {"truncation", nullptr},
                {"padding", nullptr},
                {"added_tokens", std::move(added)},
                {"normalizer", {{"type", "NFC"}}},
                {"pre_tokenizer", {{"type", "Sequence"}, {"pretokenizers", {std::move(split), byte_level_component()}}}},
                {"post_processor", byte_level_component()},
                {"decoder", byte_level_component()},
                {"model", bpe_model_json(bpe)}};
  return root.dump(2) + "\n";
}

std::string bpe_tokenizer_config_json(const TrainedBpe& bpe) {
  const auto& specials = bpe.special_tokens;
  ojson eos = nullptr, pad = nullptr;
  if (has_token(bpe, "<|im_end|>")) eos = "<|im_end|>";
  else if (!specials.empty()) eos = specials.front();
  pad = has_token(bpe, "<|endoftext|>") ? ojson("<|endoftext|>") : eos;
  ojson decoder = ojson::object(), additional = ojson::array();
  for (size_t i = 0; i < specials.size(); ++i) {
    decoder[std::to_string(bpe.tokens.size() + i)] = added_token_json(specials[i]);
    if (pad != specials[i]) additional.push_back(specials[i]);
  }
  ojson config = {{"add_bos_token", false}, {"add_prefix_space", false}, {"added_tokens_decoder", std::move(decoder)},
                  {"additional_special_tokens", std::move(additional)}, {"bos_token", nullptr}};
  if (has_token(bpe, "<|im_start|>") && has_token(bpe, "<|im_end|>")) config["chat_template"] = kChatMlTemplate;
  config.update(ojson{{"clean_up_tokenization_spaces", false}, {"eos_token", eos}, {"errors", "replace"},
                      {"pad_token", pad}, {"split_special_tokens", false}, {"tokenizer_class", "Qwen2Tokenizer"},
                      {"unk_token", nullptr}});
  return config.dump(2) + "\n";
}

// Proves that `dir` is writable by doing it: creates the folder if missing and a file in it, then
// removes both again (permission bits alone do not tell, e.g. for root or a read-only mount).
void check_output_dir(const std::string& dir) {
  FAB_USER_CHECK(!dir.empty(), "the output folder is empty");
  std::error_code ec;
  const fs::path path(dir);
  if (fs::exists(path, ec)) FAB_USER_CHECK(fs::is_directory(path, ec), "{}: exists and is not a folder", dir);
  // The first folder that create_directories would make, to remove it afterwards.
  fs::path first_created;
  for (fs::path p = fs::absolute(path, ec); !p.empty() && !fs::exists(p, ec); p = p.parent_path()) {
    first_created = p;
    if (p == p.parent_path()) break;
  }
  fs::create_directories(path, ec);
  FAB_USER_CHECK(!ec, "{}: cannot create the folder ({})", dir, ec.message());
  const fs::path probe = path / (".fabrica_write_probe_" + std::to_string(::getpid()));
  const bool writable = std::ofstream(probe).good();
  fs::remove(probe, ec);
  if (!first_created.empty()) fs::remove_all(first_created, ec);
  FAB_USER_CHECK(writable, "{}: folder is not writable", dir);
}

void save_bpe_tokenizer(const TrainedBpe& bpe, const std::string& dir) {
  check_output_dir(dir);
  std::error_code ec;
  fs::create_directories(dir, ec);
  FAB_USER_CHECK(!ec && fs::is_directory(dir), "{}: cannot create the folder ({})", dir, ec.message());
  const std::pair<std::string, std::string> files[] = {{"tokenizer.json", bpe_tokenizer_json(bpe)},
                                                       {"tokenizer_config.json", bpe_tokenizer_config_json(bpe)}};
  // Both files are written before either is renamed into place.
  std::vector<std::unique_ptr<AtomicFileWriter>> writers;
  for (const auto& [name, text] : files) {
    writers.push_back(std::make_unique<AtomicFileWriter>((fs::path(dir) / name).string()));
    writers.back()->write(text);
  }
  for (const auto& writer : writers) writer->commit();
}

}  // namespace fab
