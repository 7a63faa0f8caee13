#include "tokenizer/decoder.h"

#include "tokenizer/byte_level.h"
#include "tokenizer/unicode.h"

namespace fab::tok {
namespace {

class ByteLevelDecoder : public DecoderStep {
 public:
  void apply(std::vector<std::string>& tokens) const override {
    std::string bytes;
    for (const std::string& token : tokens) byte_level_decode_token(token, bytes);
    tokens.assign(1, utf8_lossy(bytes));
  }
};

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// The byte of a "<0xNN>" token (u8::from_str_radix accepts either case), or -1.
int fallback_byte(const std::string& token) {
  if (token.size() != 6 || token.compare(0, 3, "<0x") != 0 || token[5] != '>') return -1;
  int hi = hex_digit(token[3]), lo = hex_digit(token[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

class ByteFallbackDecoder : public DecoderStep {
 public:
  void apply(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    std::string pending;
    auto flush = [&] {
      if (pending.empty()) return;
      std::string repaired;
      if (valid_utf8(pending, repaired).data() == pending.data()) out.push_back(pending);
      else out.insert(out.end(), pending.size(), "\xEF\xBF\xBD");
      pending.clear();
    };
    for (std::string& token : tokens) {
      int byte = fallback_byte(token);
      if (byte >= 0) {
        pending.push_back(char(byte));
        continue;
      }
      flush();
      out.push_back(std::move(token));
    }
    flush();
    tokens = std::move(out);
  }
};

class FuseDecoder : public DecoderStep {
 public:
  void apply(std::vector<std::string>& tokens) const override {
    std::string joined;
    for (const std::string& token : tokens) joined += token;
    tokens.assign(1, joined);
  }
};

class StripDecoder : public DecoderStep {
 public:
  StripDecoder(char32_t content, size_t start, size_t stop) : content_(content), start_(start), stop_(stop) {}
  void apply(std::vector<std::string>& tokens) const override {
    for (std::string& token : tokens) {
      size_t begin = 0, end = token.size();
      for (size_t n = 0, pos = 0; n < start_ && pos < token.size(); ++n) {
        if (next_code_point(token, pos) != content_) break;
        begin = pos;
      }
      for (size_t n = 0, pos = token.size(); n < stop_ && pos > begin; ++n) {
        if (previous_code_point(token, pos) != content_) break;
        end = pos;
      }
      token = token.substr(begin, end - begin);
    }
  }

 private:
  char32_t content_;
  size_t start_, stop_;
};

class ReplaceDecoder : public DecoderStep {
 public:
  ReplaceDecoder(Regex pattern, std::string content) : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void apply(std::vector<std::string>& tokens) const override {
    std::vector<Span> matches;
    for (std::string& token : tokens) {
      matches.clear();
      pattern_.find_all(token, matches);
      if (matches.empty()) continue;
      std::string out;
      size_t last = 0;
      for (const Span& m : matches) {
        out.append(token, last, m.begin - last);
        out += content_;
        last = m.end;
      }
      out.append(token, last);
      token = std::move(out);
    }
  }

 private:
  Regex pattern_;
  std::string content_;
};

class MetaspaceDecoder : public DecoderStep {
 public:
  MetaspaceDecoder(char32_t replacement, bool prepends) : replacement_(replacement), prepends_(prepends) {}
  void apply(std::vector<std::string>& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::string out;
      for (size_t pos = 0; pos < tokens[i].size();) {
        size_t begin = pos;
        if (next_code_point(tokens[i], pos) != replacement_) out.append(tokens[i], begin, pos - begin);
        else if (i > 0 || !prepends_) out += ' ';
      }
      tokens[i] = std::move(out);
    }
  }

 private:
  char32_t replacement_;
  bool prepends_;
};

}  // namespace

std::unique_ptr<DecoderStep> make_metaspace_decoder(char32_t replacement, bool prepends) {
  return std::make_unique<MetaspaceDecoder>(replacement, prepends);
}
std::unique_ptr<DecoderStep> make_byte_level_decoder() { return std::make_unique<ByteLevelDecoder>(); }
std::unique_ptr<DecoderStep> make_byte_fallback_decoder() { return std::make_unique<ByteFallbackDecoder>(); }
std::unique_ptr<DecoderStep> make_fuse_decoder() { return std::make_unique<FuseDecoder>(); }
std::unique_ptr<DecoderStep> make_strip_decoder(char32_t content, size_t start, size_t stop) {
  return std::make_unique<StripDecoder>(content, start, stop);
}
std::unique_ptr<DecoderStep> make_replace_decoder(Regex pattern, std::string content) {
  return std::make_unique<ReplaceDecoder>(std::move(pattern), std::move(content));
}

std::string Decoder::run(std::vector<std::string> tokens) const {
  std::string text;
  if (steps_.empty()) {
    for (size_t i = 0; i < tokens.size(); ++i) text += (i ? " " : "") + tokens[i];
    return text;
  }
  for (const auto& step : steps_) step->apply(tokens);
  for (const std::string& token : tokens) text += token;
  return text;
}

}  // namespace fab::tok
