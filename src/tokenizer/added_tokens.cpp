#include "tokenizer/added_tokens.h"

#include <algorithm>

#include "tokenizer/bpe.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/unicode.h"

namespace fab::tok {

void AddedVocabulary::Trie::insert(std::string_view pattern, int32_t id) {
  if (pattern.empty()) return;
  first_byte[static_cast<uint8_t>(pattern[0])] = true;
  int32_t node = 0;
  for (char ch : pattern) {
    auto byte = static_cast<uint8_t>(ch);
    auto& children = nodes[node].children;
    auto it = std::lower_bound(children.begin(), children.end(), std::make_pair(byte, int32_t(-1)));
    if (it != children.end() && it->first == byte) {
      node = it->second;
      continue;
    }
    int32_t child = int32_t(nodes.size());
    children.insert(it, {byte, child});
    nodes.emplace_back();  // invalidates `children`, which is no longer used
    node = child;
  }
  nodes[node].id = id;
}

size_t AddedVocabulary::Trie::longest_at(std::string_view text, size_t pos, int32_t& id) const {
  size_t best = 0;
  int32_t node = 0;
  for (size_t i = pos; i < text.size(); ++i) {
    const auto& children = nodes[node].children;
    auto byte = static_cast<uint8_t>(text[i]);
    auto it = std::lower_bound(children.begin(), children.end(), std::make_pair(byte, int32_t(-1)));
    if (it == children.end() || it->first != byte) break;
    node = it->second;
    if (nodes[node].id >= 0) {
      best = i + 1 - pos;
      id = nodes[node].id;
    }
  }
  return best;
}

void AddedVocabulary::add(const std::vector<AddedToken>& tokens, const BpeModel& model,
                          const Normalizer* normalizer) {
  int32_t next_id = int32_t(model.vocab_size());
  if (!by_id_.empty()) next_id = std::max(max_id() + 1, next_id);
  for (const AddedToken& token : tokens) {
    if (token.content.empty()) continue;
    std::optional<int32_t> id = token_to_id(token.content);
    if (!id) id = model.token_to_id(token.content);
    if (!id) id = next_id++;
    Entry entry{token, token.content};
    if (token.normalized && normalizer) {
      std::string buffer;
      entry.matched_form = std::string(normalizer->run(token.content, buffer));
    }
    by_content_[token.content] = *id;
    if (token.special) special_.insert(token.content);
    by_id_[*id] = std::move(entry);
  }
  rebuild_tries();
}

void AddedVocabulary::add_with_ids(const std::vector<std::pair<int32_t, AddedToken>>& tokens) {
  for (const auto& [id, token] : tokens) {
    if (token.content.empty()) continue;
    Entry entry{token, token.content};
    entry.token.normalized = false;
    by_content_[token.content] = id;
    if (token.special) special_.insert(token.content);
    by_id_[id] = std::move(entry);
  }
  rebuild_tries();
}

void AddedVocabulary::rebuild_tries() {
  raw_ = Trie();
  normalized_ = Trie();
  for (const auto& [id, entry] : by_id_) (entry.token.normalized ? normalized_ : raw_).insert(entry.matched_form, id);
}

std::optional<int32_t> AddedVocabulary::token_to_id(std::string_view content) const {
  auto it = by_content_.find(std::string(content));
  if (it == by_content_.end()) return std::nullopt;
  return it->second;
}

const std::string* AddedVocabulary::id_to_token(int32_t id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &it->second.matched_form;
}

int32_t AddedVocabulary::max_id() const {
  int32_t best = -1;
  for (const auto& [id, entry] : by_id_) best = std::max(best, id);
  return best;
}

namespace {

bool ends_with_word(std::string_view text) {
  if (text.empty()) return false;
  size_t end = text.size();
  return is_word_char(previous_code_point(text, end));
}

bool starts_with_word(std::string_view text) {
  if (text.empty()) return false;
  size_t pos = 0;
  return is_word_char(next_code_point(text, pos));
}

// Start of the White_Space run that ends `text` (regex \s*$).
size_t trailing_space_start(std::string_view text) {
  size_t end = text.size();
  while (end > 0) {
    size_t pos = end;
    if (!is_white_space(previous_code_point(text, pos))) break;
    end = pos;
  }
  return end;
}

// Length of the White_Space run that starts `text` (regex ^\s*).
size_t leading_space_length(std::string_view text) {
  size_t length = 0;
  for (size_t pos = 0; pos < text.size() && is_white_space(next_code_point(text, pos));) length = pos;
  return length;
}

}  // namespace

// HF's AddedVocabulary::find_matches followed by the split that drops empty pieces.
void AddedVocabulary::split(std::string_view text, bool normalized_tokens, std::vector<Segment>& out) const {
  const Trie& trie = normalized_tokens ? normalized_ : raw_;
  if (text.empty()) return;
  if (trie.empty()) {
    out.push_back({text, -1});
    return;
  }
  size_t emitted = 0;  // HF's start_offset
  for (size_t pos = 0; pos < text.size();) {
    int32_t id = -1;
    size_t length = trie.first_byte[static_cast<uint8_t>(text[pos])] ? trie.longest_at(text, pos, id) : 0;
    if (length == 0) {
      ++pos;
      continue;
    }
    size_t start = pos, stop = pos + length;
    pos = stop;  // the search resumes after the match itself, before any rstrip
    const AddedToken& token = by_id_.at(id).token;
    if (token.single_word && (ends_with_word(text.substr(0, start)) || starts_with_word(text.substr(stop))))
      continue;
    if (token.lstrip) start = std::max(trailing_space_start(text.substr(0, start)), emitted);
    if (token.rstrip) stop += leading_space_length(text.substr(stop));
    if (emitted < start) out.push_back({text.substr(emitted, start - emitted), -1});
    out.push_back({text.substr(start, stop - start), id});
    emitted = stop;
  }
  if (emitted < text.size()) out.push_back({text.substr(emitted), -1});
}

}  // namespace fab::tok
