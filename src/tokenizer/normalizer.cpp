#include "tokenizer/normalizer.h"

#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/uniset.h>

#include "core/error.h"
#include "tokenizer/unicode.h"

namespace fab::tok {
namespace {

bool is_ascii(std::string_view text) {
  for (char c : text)
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  return true;
}

// HF normalizes with the unicode-normalization-alignments crate, whose tables are Unicode 9.0:
// characters assigned later are neither decomposed nor reordered there. ICU's filtered
// normalizer does the same when restricted to [:age=9.0:] (checked code point by code point).
const icu::UnicodeSet& hf_unicode_version() {
  static const icu::UnicodeSet set = [] {
    UErrorCode status = U_ZERO_ERROR;
    icu::UnicodeSet s(icu::UnicodeString(u"[:age=9.0:]"), status);
    FAB_CHECK(U_SUCCESS(status), "ICU UnicodeSet [:age=9.0:]: {}", u_errorName(status));
    s.freeze();
    return s;
  }();
  return set;
}

class UnicodeNormalizer : public NormalizerStep {
 public:
  explicit UnicodeNormalizer(UnicodeForm form) {
    UErrorCode status = U_ZERO_ERROR;
    const icu::Normalizer2* full = nullptr;
    switch (form) {
      case UnicodeForm::nfc: full = icu::Normalizer2::getNFCInstance(status); break;
      case UnicodeForm::nfd: full = icu::Normalizer2::getNFDInstance(status); break;
      case UnicodeForm::nfkc: full = icu::Normalizer2::getNFKCInstance(status); break;
      case UnicodeForm::nfkd: full = icu::Normalizer2::getNFKDInstance(status); break;
    }
    FAB_CHECK(U_SUCCESS(status) && full, "ICU normalizer unavailable: {}", u_errorName(status));
    filtered_ = std::make_unique<icu::FilteredNormalizer2>(*full, hf_unicode_version());
    impl_ = filtered_.get();
  }

  bool apply(std::string_view in, std::string& out) const override {
    if (is_ascii(in)) return false;  // ASCII is invariant under all four forms
    UErrorCode status = U_ZERO_ERROR;
    icu::StringPiece piece(in.data(), int32_t(in.size()));
    if (impl_->isNormalizedUTF8(piece, status) && U_SUCCESS(status)) return false;
    status = U_ZERO_ERROR;
    out.clear();
    icu::StringByteSink<std::string> sink(&out, int32_t(in.size()));
    impl_->normalizeUTF8(0, piece, sink, nullptr, status);
    FAB_CHECK(U_SUCCESS(status), "ICU normalization failed: {}", u_errorName(status));
    return true;
  }

 private:
  std::unique_ptr<icu::FilteredNormalizer2> filtered_;
  const icu::Normalizer2* impl_ = nullptr;
};

class Lowercase : public NormalizerStep {
 public:
  bool apply(std::string_view in, std::string& out) const override {
    out.clear();
    bool changed = false;
    size_t pos = 0;
    while (pos < in.size()) {
      char32_t cp = next_code_point(in, pos);
      if (cp == 0x130) {  // the one unconditional multi-character lowercase: İ -> i + U+0307
        out += "i\xCC\x87";
        changed = true;
        continue;
      }
      char32_t lower = to_lower(cp);
      changed |= lower != cp;
      append_utf8(out, lower);
    }
    return changed;
  }
};

class Strip : public NormalizerStep {
 public:
  Strip(bool left, bool right) : left_(left), right_(right) {}
  bool apply(std::string_view in, std::string& out) const override {
    size_t begin = 0, end = in.size();
    if (left_) {
      for (size_t pos = 0; pos < end && is_white_space(next_code_point(in, pos));) begin = pos;
    }
    if (right_) {
      for (size_t pos = end; pos > begin;) {
        if (!is_white_space(previous_code_point(in, pos))) break;
        end = pos;
      }
    }
    if (begin == 0 && end == in.size()) return false;
    out.assign(in.substr(begin, end - begin));
    return true;
  }

 private:
  bool left_, right_;
};

class Prepend : public NormalizerStep {
 public:
  explicit Prepend(std::string prefix) : prefix_(std::move(prefix)) {}
  bool apply(std::string_view in, std::string& out) const override {
    if (in.empty() || prefix_.empty()) return false;
    out.assign(prefix_);
    out.append(in);
    return true;
  }

 private:
  std::string prefix_;
};

class Replace : public NormalizerStep {
 public:
  Replace(Regex pattern, std::string content) : pattern_(std::move(pattern)), content_(std::move(content)) {}
  bool apply(std::string_view in, std::string& out) const override {
    std::vector<Span> matches;
    pattern_.find_all(in, matches);
    if (matches.empty()) return false;
    out.clear();
    size_t last = 0;
    for (const Span& m : matches) {
      out.append(in.substr(last, m.begin - last));
      out.append(content_);
      last = m.end;
    }
    out.append(in.substr(last));
    return true;
  }

 private:
  Regex pattern_;
  std::string content_;
};

}  // namespace

std::unique_ptr<NormalizerStep> make_unicode_normalizer(UnicodeForm form) {
  return std::make_unique<UnicodeNormalizer>(form);
}
std::unique_ptr<NormalizerStep> make_lowercase() { return std::make_unique<Lowercase>(); }
std::unique_ptr<NormalizerStep> make_strip(bool left, bool right) { return std::make_unique<Strip>(left, right); }
std::unique_ptr<NormalizerStep> make_prepend(std::string prefix) {
  return std::make_unique<Prepend>(std::move(prefix));
}
std::unique_ptr<NormalizerStep> make_replace(Regex pattern, std::string content) {
  return std::make_unique<Replace>(std::move(pattern), std::move(content));
}

std::string_view Normalizer::run(std::string_view in, std::string& buffer) const {
  std::string_view current = in;
  std::string scratch;
  for (const auto& step : steps_) {
    if (step->apply(current, scratch)) {
      buffer.swap(scratch);
      current = buffer;
    }
  }
  return current;
}

}  // namespace fab::tok
