#include "tokenizer/post_processor.h"

namespace fab::tok {

std::vector<int32_t> PostProcessor::apply(std::vector<int32_t> ids) const {
  for (const auto& items : templates_) {
    std::vector<int32_t> out;
    out.reserve(ids.size() + 8);
    for (const Item& item : items) {
      const auto& source = item.is_sequence ? ids : item.ids;
      out.insert(out.end(), source.begin(), source.end());
    }
    ids = std::move(out);
  }
  return ids;
}

}  // namespace fab::tok
