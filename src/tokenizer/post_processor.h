#pragma once
// tokenizer.json "post_processor", single-sequence case only: the ids a template puts around the
// encoded text when encode() is asked to add special tokens (HF processors/template.rs,
// roberta.rs, bert.rs). ByteLevel only trims offsets, so it adds nothing here.
#include <cstdint>
#include <vector>

namespace fab::tok {

class PostProcessor {
 public:
  // One template item: the sequence itself (is_sequence) or a run of special-token ids.
  struct Item {
    bool is_sequence = false;
    std::vector<int32_t> ids;
  };
  // Appends a template (e.g. "<|begin_of_text|> $A"); templates of a Sequence apply in order.
  void add_template(std::vector<Item> items) { templates_.push_back(std::move(items)); }

  // `ids` with the templates applied.
  std::vector<int32_t> apply(std::vector<int32_t> ids) const;

 private:
  std::vector<std::vector<Item>> templates_;
};

}  // namespace fab::tok
