// libFuzzer target for SentencePiece tokenizer.model loading, then encoding and decoding a fixed
// text with whatever loaded (`make fuzz`). Seeds: fuzz/corpus/spm_model and, when present, the
// trained model of build/reference/spm.
#include <cstdint>
#include <string>

#include "core/error.h"
#include "tokenizer/spm_tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view model(reinterpret_cast<const char*>(data), size);
  try {
    const fab::tok::SpmTokenizer t(model, "fuzz.model", {});
    std::vector<int32_t> ids;
    t.encode_into("Hello, world! 你好 123 <s> </s> <unk>", ids);
    for (int32_t id : t.add_special_tokens(ids))
      if (id < 0 || id >= t.vocab_size()) __builtin_trap();  // every id must exist
    t.decode(ids, false);
  } catch (const fab::UserError&) {
  }
  return 0;
}
