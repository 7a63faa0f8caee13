#pragma once
// The alpaca and sharegpt converters: one raw JSON record -> one aligned Example.
// Mirrors LLaMA-Factory data/converter.py (AlpacaDatasetConverter, SharegptDatasetConverter).
#include <string>

#include "dataset/dataset.h"
#include "dataset/dataset_reader.h"

namespace fab {

// Why a sharegpt record was kept empty ("" when it was fine): LLaMA-Factory logs and skips such
// "abnormal" examples instead of failing.
struct ConvertResult {
  Example example;
  std::string broken_reason;
};

// Alpaca: [history pairs as user/assistant turns], user = prompt + "\n" + query (whichever are
// non-empty), response from `response`, or chosen/rejected for ranking, or kto_tag.
ConvertResult convert_alpaca(const RawRecord& record, const DatasetAttr& attr);

// Sharegpt: an optional leading system message, then roles alternating user|observation and
// assistant|function; an even count (odd for ranking, whose answers come from chosen/rejected).
ConvertResult convert_sharegpt(const RawRecord& record, const DatasetAttr& attr);

// A record carrying "input_ids" (and optionally "labels", default: a copy of input_ids).
bool is_pretokenized_record(const Json& record);
Example convert_pretokenized(const RawRecord& record);

// Dispatches on attr.formatting (and pre-tokenised records).
ConvertResult convert_record(const RawRecord& record, const DatasetAttr& attr);

}  // namespace fab
