#pragma once
// Added tokens (tokenizer.json "added_tokens"; HF tokenizer/added_vocabulary.rs). They are found
// in the text before the normalizer and pre-tokenizer run and become one id each, whatever the
// model would have made of them. Tokens with normalized=false are looked for in the raw text;
// those with normalized=true in the normalized text, in their normalized form. Matching is
// leftmost-longest; single_word, lstrip and rstrip apply as in HF's find_matches.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace fab::tok {

struct AddedToken {
  std::string content;
  bool single_word = false;  // only where no word character touches it on either side
  bool lstrip = false;       // also swallows the White_Space before it
  bool rstrip = false;       // also swallows the White_Space after it
  bool normalized = true;    // matched after normalization
  bool special = false;      // dropped by decode(skip_special_tokens)
};

// A piece of text, or an added token (id >= 0) with the text it covers.
struct Segment {
  std::string_view text;
  int32_t id = -1;
};

class BpeModel;
class Normalizer;

class AddedVocabulary {
 public:
  // HF's AddedVocabulary::add_tokens, in file order: a token keeps the id its content already has
  // (an earlier added token or the model's vocabulary), else takes the next free id after both.
  // Normalized tokens are matched in the form `normalizer` gives them.
  void add(const std::vector<AddedToken>& tokens, const BpeModel& model, const Normalizer* normalizer);
  // Tokens with the ids they are given (tokenizer_config.json's added_tokens_decoder), all looked
  // for in the raw text whatever their `normalized`, as transformers' slow tokenizers do.
  void add_with_ids(const std::vector<std::pair<int32_t, AddedToken>>& tokens);

  // Splits `text` into text segments and added-token segments (non-empty segments only).
  // `normalized_tokens` selects which of the two sets of tokens is looked for.
  void split(std::string_view text, bool normalized_tokens, std::vector<Segment>& out) const;
  bool has_normalized_tokens() const { return !normalized_.empty(); }

  std::optional<int32_t> token_to_id(std::string_view content) const;
  // The token's content (its normalized form for normalized tokens), or nullptr.
  const std::string* id_to_token(int32_t id) const;
  bool is_special(std::string_view content) const { return special_.count(std::string(content)) != 0; }
  bool empty() const { return by_id_.empty(); }
  int32_t max_id() const;

 private:
  // A byte trie over the patterns of one of the two sets: leftmost-longest search.
  struct Trie {
    struct Node {
      std::vector<std::pair<uint8_t, int32_t>> children;  // sorted by byte
      int32_t id = -1;                                      // token ending here
    };
    std::vector<Node> nodes{Node{}};
    bool first_byte[256] = {};
    void insert(std::string_view pattern, int32_t id);
    bool empty() const { return nodes.size() == 1; }
    // Longest pattern starting at text[pos]: its length, with its id in `id`; 0 if none.
    size_t longest_at(std::string_view text, size_t pos, int32_t& id) const;
  };
  struct Entry {
    AddedToken token;
    std::string matched_form;  // normalized content for normalized tokens, else content
  };
  void rebuild_tries();

  std::unordered_map<std::string, int32_t> by_content_;
  std::unordered_map<int32_t, Entry> by_id_;
  std::unordered_set<std::string> special_;
  Trie raw_, normalized_;
};

}  // namespace fab::tok
