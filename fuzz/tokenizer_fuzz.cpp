// libFuzzer target for tokenizer.json loading and for encoding/decoding (`make fuzz`).
// First byte even: the rest is a tokenizer.json to load (then used on a fixed text);
// odd: the rest is text for the tokenizer in $FAB_FUZZ_TOKENIZER (a real one, e.g. Qwen3).
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace {

const fab::Tokenizer* fixed_tokenizer() {
  static std::unique_ptr<fab::Tokenizer> tokenizer = [] {
    const char* path = std::getenv("FAB_FUZZ_TOKENIZER");
    return path ? std::make_unique<fab::Tokenizer>(fab::Tokenizer::load(path)) : nullptr;
  }();
  return tokenizer.get();
}

void round_trip(const fab::Tokenizer& t, std::string_view text) {
  for (bool special : {false, true}) {
    const std::vector<int32_t> ids = t.encode(text, special);
    for (int32_t id : ids)
      if (id < 0 || id >= t.vocab_size()) __builtin_trap();  // every id must exist
    t.decode(ids, special);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    if (data[0] % 2 == 0) {
      const fab::Tokenizer t = fab::Tokenizer::from_json(rest, "fuzz.json");
      round_trip(t, "Hello, world! 你好 123 <|im_end|>");
    } else if (const fab::Tokenizer* t = fixed_tokenizer()) {
      round_trip(*t, rest);
    }
  } catch (const fab::UserError&) {
  }
  return 0;
}
