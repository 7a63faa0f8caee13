#include "tokenizer/pretokenizer.h"

#include <algorithm>

#include "tokenizer/byte_level.h"
#include "tokenizer/unicode.h"

namespace fab::tok {
namespace {

struct Match {
  Span span;
  bool is_match;
};

// Pattern::find_matches: the whole piece as alternating non-match / match spans.
void regex_matches(const Regex& regex, std::string_view piece, bool invert, std::vector<Match>& out) {
  thread_local std::vector<Span> found;
  found.clear();
  regex.find_all(piece, found);
  size_t prev = 0;
  for (const Span& m : found) {
    if (prev != m.begin) out.push_back({{prev, m.begin}, invert});
    out.push_back({m, !invert});
    prev = m.end;
  }
  if (prev != piece.size()) out.push_back({{prev, piece.size()}, invert});
}

// NormalizedString::split: merges spans according to `behavior`, drops removed and empty ones.
void split_by_behavior(std::string_view piece, const std::vector<Match>& matches, SplitBehavior behavior,
                       Words& out) {
  thread_local std::vector<Match> kept;  // is_match now means "remove"
  kept.clear();
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::isolated:
      for (const Match& m : matches) kept.push_back({m.span, false});
      break;
    case SplitBehavior::removed:
      kept = matches;
      break;
    case SplitBehavior::contiguous:
      for (const Match& m : matches) {
        if (m.is_match == previous_match && !kept.empty()) kept.back().span.end = m.span.end;
        else kept.push_back({m.span, false});
        previous_match = m.is_match;
      }
      break;
    case SplitBehavior::merged_with_previous:
      for (const Match& m : matches) {
        if (m.is_match && !previous_match && !kept.empty()) kept.back().span.end = m.span.end;
        else kept.push_back({m.span, false});
        previous_match = m.is_match;
      }
      break;
    case SplitBehavior::merged_with_next:
      for (auto it = matches.rbegin(); it != matches.rend(); ++it) {
        if (it->is_match && !previous_match && !kept.empty()) kept.back().span.begin = it->span.begin;
        else kept.push_back({it->span, false});
        previous_match = it->is_match;
      }
      std::reverse(kept.begin(), kept.end());
      break;
  }
  for (const Match& m : kept)
    if (!m.is_match && m.span.end > m.span.begin) out.pieces.push_back(piece.substr(m.span.begin, m.span.end - m.span.begin));
}

class Split : public PreTokenizerStep {
 public:
  Split(Regex pattern, SplitBehavior behavior, bool invert)
      : pattern_(std::move(pattern)), behavior_(behavior), invert_(invert) {}

  void apply(const std::vector<std::string_view>& in, Words& out) const override {
    thread_local std::vector<Match> matches;
    for (std::string_view piece : in) {
      matches.clear();
      regex_matches(pattern_, piece, invert_, matches);
      split_by_behavior(piece, matches, behavior_, out);
    }
  }

 private:
  Regex pattern_;
  SplitBehavior behavior_;
  bool invert_;
};

// GPT-2's pattern (HF pre_tokenizers/byte_level.rs RE).
const Regex& gpt2_regex() {
  static const Regex regex(R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)", false);
  return regex;
}

class ByteLevel : public PreTokenizerStep {
 public:
  ByteLevel(bool add_prefix_space, bool use_regex) : add_prefix_space_(add_prefix_space), use_regex_(use_regex) {}

  void apply(const std::vector<std::string_view>& in, Words& out) const override {
    thread_local std::vector<Match> matches;
    for (std::string_view piece : in) {
      if (add_prefix_space_ && piece.front() != ' ') {
        std::string prefixed(1, ' ');
        prefixed.append(piece);
        piece = out.replace(piece, std::move(prefixed));
      }
      if (!use_regex_) {
        out.pieces.push_back(piece);
        continue;
      }
      matches.clear();
      regex_matches(gpt2_regex(), piece, false, matches);
      split_by_behavior(piece, matches, SplitBehavior::isolated, out);
    }
  }
  bool is_byte_level() const override { return true; }

 private:
  bool add_prefix_space_, use_regex_;
};

// Digits: numeric characters (Rust char::is_numeric, general category N) isolated one by one, or
// in contiguous runs.
class Digits : public PreTokenizerStep {
 public:
  explicit Digits(bool individual) : individual_(individual) {}

  void apply(const std::vector<std::string_view>& in, Words& out) const override {
    thread_local std::vector<Match> matches;
    for (std::string_view piece : in) {
      matches.clear();
      size_t last = 0;
      for (size_t pos = 0; pos < piece.size();) {
        size_t start = pos;
        if (!is_numeric(next_code_point(piece, pos))) continue;
        if (last < start) matches.push_back({{last, start}, false});
        matches.push_back({{start, pos}, true});
        last = pos;
      }
      if (last < piece.size()) matches.push_back({{last, piece.size()}, false});
      split_by_behavior(piece, matches, individual_ ? SplitBehavior::isolated : SplitBehavior::contiguous, out);
    }
  }

 private:
  bool individual_;
};

class Metaspace : public PreTokenizerStep {
 public:
  Metaspace(char32_t replacement, PrependScheme scheme, bool split) : scheme_(scheme), split_(split) {
    append_utf8(replacement_, replacement);
  }

  void apply(const std::vector<std::string_view>& in, Words& out) const override {
    thread_local std::vector<Match> matches;
    for (std::string_view piece : in) {
      std::string text;
      for (char c : piece) {
        if (c == ' ') text += replacement_;
        else text += c;
      }
      bool prepend = scheme_ == PrependScheme::always || (scheme_ == PrependScheme::first && piece.data() == out.input_start);
      if (prepend && text.compare(0, replacement_.size(), replacement_) != 0) text.insert(0, replacement_);
      piece = out.replace(piece, std::move(text));
      if (!split_) {
        out.pieces.push_back(piece);
        continue;
      }
      matches.clear();  // every replacement character is a match, merged with what follows
      size_t last = 0;
      for (size_t at = piece.find(replacement_); at != std::string_view::npos; at = piece.find(replacement_, last)) {
        if (last < at) matches.push_back({{last, at}, false});
        last = at + replacement_.size();
        matches.push_back({{at, last}, true});
      }
      if (last < piece.size()) matches.push_back({{last, piece.size()}, false});
      split_by_behavior(piece, matches, SplitBehavior::merged_with_next, out);
    }
  }

 private:
  std::string replacement_;
  PrependScheme scheme_;
  bool split_;
};

void map_to_byte_level(Words& words) {
  for (std::string_view& piece : words.pieces) {
    std::string mapped;
    byte_level_encode(piece, mapped);
    piece = words.replace(piece, std::move(mapped));
  }
  words.byte_level = false;
}

}  // namespace

std::unique_ptr<PreTokenizerStep> make_split(Regex pattern, SplitBehavior behavior, bool invert) {
  return std::make_unique<Split>(std::move(pattern), behavior, invert);
}
std::unique_ptr<PreTokenizerStep> make_byte_level(bool add_prefix_space, bool use_regex) {
  return std::make_unique<ByteLevel>(add_prefix_space, use_regex);
}
std::unique_ptr<PreTokenizerStep> make_digits(bool individual_digits) {
  return std::make_unique<Digits>(individual_digits);
}
std::unique_ptr<PreTokenizerStep> make_metaspace(char32_t replacement, PrependScheme scheme, bool split) {
  return std::make_unique<Metaspace>(replacement, scheme, split);
}

void PreTokenizer::run(std::string_view text, bool begins_input, Words& words) const {
  words.clear();
  if (text.empty()) return;  // HF drops empty splits
  words.pieces.push_back(text);
  if (begins_input) words.input_start = text.data();
  thread_local std::vector<std::string_view> input;
  for (const auto& step : steps_) {
    // A ByteLevel step followed by another step: the next one sees the mapped text, as in HF.
    if (words.byte_level) map_to_byte_level(words);
    input.swap(words.pieces);
    words.pieces.clear();
    step->apply(input, words);
    words.byte_level = step->is_byte_level();
  }
}

}  // namespace fab::tok
