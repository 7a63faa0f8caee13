// Validation of a safetensors header, kept apart from the file and tensor code so the fuzz target
// (fuzz/safetensors_header_fuzz.cpp) can link it alone.
#include <algorithm>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/safetensors.h"

namespace fab {
namespace {

using nlohmann::json;

size_t stored_size(const std::string& dtype) {
  if (dtype == "F64" || dtype == "I64" || dtype == "U64") return 8;
  if (dtype == "F32" || dtype == "I32" || dtype == "U32") return 4;
  if (dtype == "F16" || dtype == "BF16" || dtype == "I16" || dtype == "U16") return 2;
  if (dtype == "I8" || dtype == "U8" || dtype == "BOOL") return 1;
  return 0;
}

SafetensorsEntry parse_entry(const std::string& name, const json& value, size_t data_bytes, const std::string& source) {
  FAB_USER_CHECK(value.is_object() && value.contains("dtype") && value.contains("shape") &&
                     value.contains("data_offsets"),
                 "{}: tensor \"{}\" needs dtype, shape and data_offsets", source, name);
  SafetensorsEntry e;
  FAB_USER_CHECK(value["dtype"].is_string(), "{}: tensor \"{}\": dtype must be a string", source, name);
  e.dtype = value["dtype"].get<std::string>();
  const size_t elem = stored_size(e.dtype);
  FAB_USER_CHECK(elem != 0, "{}: tensor \"{}\": unknown dtype \"{}\"", source, name, e.dtype);
  FAB_USER_CHECK(value["shape"].is_array(), "{}: tensor \"{}\": shape must be an array", source, name);
  size_t count = 1;
  for (const json& d : value["shape"]) {
    FAB_USER_CHECK(d.is_number_unsigned() && d.get<uint64_t>() < (uint64_t(1) << 40),
                   "{}: tensor \"{}\": bad dimension {}", source, name, d.dump());
    const uint64_t dim = d.get<uint64_t>();
    FAB_USER_CHECK(dim == 0 || count <= (size_t(1) << 50) / dim, "{}: tensor \"{}\" is too large", source, name);
    count *= size_t(dim);
    e.shape.push_back(int64_t(dim));
  }
  const json& off = value["data_offsets"];
  FAB_USER_CHECK(off.is_array() && off.size() == 2 && off[0].is_number_unsigned() && off[1].is_number_unsigned(),
                 "{}: tensor \"{}\": data_offsets must be [begin, end]", source, name);
  e.begin = off[0].get<size_t>();
  e.end = off[1].get<size_t>();
  FAB_USER_CHECK(e.begin <= e.end && e.end <= data_bytes,
                 "{}: tensor \"{}\": data_offsets [{}, {}] outside the {} data bytes", source, name, e.begin, e.end,
                 data_bytes);
  FAB_USER_CHECK(e.end - e.begin == count * elem, "{}: tensor \"{}\": {} bytes stored but {} elements of {} need {}",
                 source, name, e.end - e.begin, count, e.dtype, count * elem);
  return e;
}

// As the safetensors library: no byte belongs to two tensors.
void check_no_overlap(const std::map<std::string, SafetensorsEntry>& entries, const std::string& source) {
  std::vector<std::pair<const std::string*, const SafetensorsEntry*>> by_offset;
  for (const auto& [name, entry] : entries)
    if (entry.end > entry.begin) by_offset.push_back({&name, &entry});
  std::sort(by_offset.begin(), by_offset.end(), [](const auto& a, const auto& b) { return a.second->begin < b.second->begin; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const auto& [name, entry] = by_offset[i];
    const auto& [previous_name, previous] = by_offset[i - 1];
    FAB_USER_CHECK(entry->begin >= previous->end,
                   "{}: tensors \"{}\" (data_offsets [{}, {}]) and \"{}\" ([{}, {}]) overlap", source, *previous_name,
                   previous->begin, previous->end, *name, entry->begin, entry->end);
  }
}

}  // namespace

void parse_safetensors_header(const std::string& text, size_t data_bytes, const std::string& source,
                              std::map<std::string, SafetensorsEntry>& entries,
                              std::map<std::string, std::string>& metadata) {
  json header;
  try {
    header = json::parse(text);
  } catch (const json::exception& e) {
    throw UserError(format("{}: safetensors header is not valid JSON ({})", source, e.what()));
  }
  FAB_USER_CHECK(header.is_object(), "{}: safetensors header must be a JSON object", source);
  for (auto& [name, value] : header.items()) {
    if (name != "__metadata__") {
      entries[name] = parse_entry(name, value, data_bytes, source);
      continue;
    }
    FAB_USER_CHECK(value.is_object(), "{}: __metadata__ must be an object of strings", source);
    for (auto& [k, v] : value.items()) {
      FAB_USER_CHECK(v.is_string(), "{}: __metadata__.{} must be a string", source, k);
      metadata[k] = v.get<std::string>();
    }
  }
  check_no_overlap(entries, source);
}

}  // namespace fab
