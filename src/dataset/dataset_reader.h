#pragma once
// Reading dataset files into JSON records, as Hugging Face `datasets.load_dataset` does for the
// file types LLaMA-Factory accepts (extras/constants.py FILEEXT2TYPE): "json" for .json and .jsonl
// (a JSON array of objects, or one object per line) and "text" for .txt (one record {"text": line}
// per line, as datasets' text builder splits them). csv, parquet and arrow are not supported.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace fab {

using Json = nlohmann::ordered_json;  // keeps key order, which Python's json.dumps reproduces

struct RecordSource {
  std::string file;  // path of the file the record came from
  int64_t index = 0; // 0-based record index within that file
  std::string where() const;  // "file: record N"
};

struct RawRecord {
  Json value;
  RecordSource source;
};

// Every record of `path` (a file, or a folder whose files are read in name order, hidden files
// skipped; they must all share one type). Throws UserError naming the file and line for unreadable or malformed input.
std::vector<RawRecord> read_dataset_records(const std::string& path);

// The file type LLaMA-Factory would pick from the extension: "json", "text", or "" if unsupported.
std::string dataset_file_type(const std::string& path);

// Lines as datasets' text builder yields them: universal newlines ("\n", "\r\n", "\r") end a
// line, the line end is dropped, and a final line end does not start an empty line.
std::vector<std::string> split_text_lines(std::string_view text);

// "string", "number", "array", ... for error messages.
std::string json_type_name(const Json& value);

}  // namespace fab
