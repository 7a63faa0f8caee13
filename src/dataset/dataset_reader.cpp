#include "dataset/dataset_reader.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace fab {

namespace fs = std::filesystem;

std::string RecordSource::where() const { return fab::format("{}: record {}", file, index); }

std::string json_type_name(const Json& value) {
  switch (value.type()) {
    case Json::value_t::null: return "null";
    case Json::value_t::object: return "object";
    case Json::value_t::array: return "array";
    case Json::value_t::string: return "string";
    case Json::value_t::boolean: return "boolean";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned: return "integer";
    case Json::value_t::number_float: return "number";
    default: return "value";
  }
}

std::string dataset_file_type(const std::string& path) {
  std::string ext = fs::path(path).extension().string();
  if (ext == ".json" || ext == ".jsonl") return "json";
  if (ext == ".txt") return "text";
  return "";
}

namespace {

std::string read_text_file(const std::string& path, bool strip_bom) {
  std::ifstream in(path, std::ios::binary);
  FAB_USER_CHECK(in.good(), "cannot open dataset file {}", path);
  std::ostringstream buffer;
  buffer << in.rdbuf();
  std::string text = buffer.str();
  if (strip_bom && text.rfind("\xEF\xBB\xBF", 0) == 0) text.erase(0, 3);  // a UTF-8 byte-order mark
  return text;
}

// 1-based line number of a byte offset, for error messages.
int64_t line_of(std::string_view text, size_t byte) {
  byte = std::min(byte, text.size());
  return 1 + std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(byte), '\n');
}

std::vector<RawRecord> records_from_array(const std::string& path, const std::string& text) {
  Json doc;
  try {
    doc = Json::parse(text);
  } catch (const Json::parse_error& e) {
    throw UserError(fab::format("{}: line {}: invalid JSON ({})", path, line_of(text, e.byte), e.what()));
  } catch (const Json::exception& e) {  // e.g. a number too large for any type
    throw UserError(fab::format("{}: invalid JSON ({})", path, e.what()));
  }
  std::vector<RawRecord> records;
  records.reserve(doc.size());
  for (size_t i = 0; i < doc.size(); ++i) {
    RecordSource source{path, static_cast<int64_t>(i)};
    FAB_USER_CHECK(doc[i].is_object(), "{}: expected a JSON object, got {}", source.where(),
                   json_type_name(doc[i]));
    records.push_back({std::move(doc[i]), std::move(source)});
  }
  return records;
}

// One JSON object per line (blank lines ignored), as pyarrow's JSON-lines reader accepts.
std::vector<RawRecord> records_from_lines(const std::string& path, const std::string& text) {
  std::vector<RawRecord> records;
  size_t start = 0;
  int64_t line_no = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    ++line_no;
    std::string_view line(text.data() + start, end - start);
    start = end + 1;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    Json value;
    try {
      value = Json::parse(line);
    } catch (const Json::exception& e) {
      throw UserError(fab::format("{}: line {}: invalid JSON ({}); expected a JSON array of objects or one "
                                  "JSON object per line", path, line_no, e.what()));
    }
    RecordSource source{path, static_cast<int64_t>(records.size())};
    FAB_USER_CHECK(value.is_object(), "{} (line {}): expected a JSON object, got {}", source.where(), line_no,
                   json_type_name(value));
    records.push_back({std::move(value), std::move(source)});
  }
  return records;
}

std::vector<RawRecord> read_json_records(const std::string& path) {
  std::string text = read_text_file(path, /*strip_bom=*/true);
  size_t first = text.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) return {};
  if (text[first] == '[') return records_from_array(path, text);
  return records_from_lines(path, text);
}

std::vector<RawRecord> read_text_records(const std::string& path) {
  std::string text = read_text_file(path, /*strip_bom=*/false);  // Python's "utf-8" keeps a BOM
  std::vector<RawRecord> records;
  for (std::string& line : split_text_lines(text)) {
    RecordSource source{path, static_cast<int64_t>(records.size())};
    records.push_back({Json{{"text", std::move(line)}}, std::move(source)});
  }
  return records;
}

std::vector<std::string> files_of(const std::string& path) {
  std::error_code ec;
  if (fs::is_regular_file(path, ec)) return {path};
  FAB_USER_CHECK(fs::is_directory(path, ec), "dataset file {} not found", path);
  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(path, ec)) {
    std::string name = entry.path().filename().string();
    if (!name.empty() && name[0] != '.' && entry.is_regular_file()) files.push_back(entry.path().string());
  }
  std::sort(files.begin(), files.end());
  FAB_USER_CHECK(!files.empty(), "dataset folder {} has no files", path);
  return files;
}

}  // namespace

std::vector<std::string> split_text_lines(std::string_view text) {
  std::vector<std::string> lines;
  std::string current;
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (c != '\n' && c != '\r') {
      current.push_back(c);
      continue;
    }
    if (c == '\r' && i + 1 < text.size() && text[i + 1] == '\n') ++i;  // "\r\n" is one line end
    lines.push_back(std::move(current));
    current.clear();
  }
  if (!current.empty()) lines.push_back(std::move(current));
  return lines;
}

std::vector<RawRecord> read_dataset_records(const std::string& path) {
  std::vector<std::string> files = files_of(path);
  std::string type = dataset_file_type(files[0]);
  FAB_USER_CHECK(!type.empty(), "{}: unsupported dataset file type (allowed: .json, .jsonl, .txt)", files[0]);
  std::vector<RawRecord> records;
  for (const std::string& file : files) {
    FAB_USER_CHECK(dataset_file_type(file) == type, "{}: file types in one dataset folder should be identical",
                   file);
    std::vector<RawRecord> part = type == "json" ? read_json_records(file) : read_text_records(file);
    std::move(part.begin(), part.end(), std::back_inserter(records));
  }
  return records;
}

}  // namespace fab
