#include "dataset/dataset.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>

#include "core/error.h"
#include "dataset/dataset_formats.h"
#include "dataset/dataset_reader.h"

namespace fab {

namespace fs = std::filesystem;

std::string_view role_name(Role role) {
  switch (role) {
    case Role::user: return "user";
    case Role::assistant: return "assistant";
    case Role::system: return "system";
    case Role::function: return "function";
    case Role::observation: return "observation";
  }
  return "?";
}

std::string ExampleOrigin::where() const { return file ? RecordSource{*file, index}.where() : std::string(); }

std::vector<std::string> split_dataset_names(std::string_view names) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    size_t comma = names.find(',', start);
    std::string_view item = names.substr(start, comma == std::string_view::npos ? names.npos : comma - start);
    size_t b = item.find_first_not_of(" \t\r\n"), e = item.find_last_not_of(" \t\r\n");
    std::string name = b == std::string_view::npos ? "" : std::string(item.substr(b, e - b + 1));
    FAB_USER_CHECK(!name.empty(), "dataset list '{}' has an empty name", names);
    out.push_back(std::move(name));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return out;
}

namespace {

constexpr const char* kDataConfig = "dataset_info.json";

std::string where_in_info(const std::string& name, const std::string& field) {
  return fab::format("{}: dataset '{}': field '{}'", kDataConfig, name, field);
}

// Reads `field` of `obj` into `out` when present; a null value resets it to nullopt.
void read_optional_string(const Json& obj, const std::string& field, const std::string& name,
                          std::optional<std::string>* out) {
  auto it = obj.find(field);
  if (it == obj.end() || it->is_null()) {
    *out = std::nullopt;
    return;
  }
  FAB_USER_CHECK(it->is_string(), "{}: expected a string, got {}", where_in_info(name, field), json_type_name(*it));
  *out = it->get<std::string>();
}

// LLaMA-Factory's DatasetAttr.join: a "columns"/"tags" object sets every listed attribute and resets
// the unlisted ones to None (its set_attr default), defaults included.
void join_group(const Json& entry, const char* group, const std::string& name,
                const std::vector<std::pair<const char*, std::optional<std::string>*>>& fields) {
  auto it = entry.find(group);
  if (it == entry.end()) return;
  FAB_USER_CHECK(it->is_object(), "{}: expected an object, got {}", where_in_info(name, group), json_type_name(*it));
  for (const auto& [key, target] : fields) read_optional_string(*it, key, name, target);
}

void join_columns(const Json& entry, const std::string& name, DatasetAttr* a) {
  join_group(entry, "columns", name,
             {{"prompt", &a->prompt}, {"query", &a->query}, {"response", &a->response}, {"history", &a->history},
              {"messages", &a->messages}, {"system", &a->system}, {"tools", &a->tools}, {"images", &a->images},
              {"videos", &a->videos}, {"audios", &a->audios}, {"chosen", &a->chosen}, {"rejected", &a->rejected},
              {"kto_tag", &a->kto_tag}});
  join_group(entry, "tags", name,
             {{"role_tag", &a->role_tag}, {"content_tag", &a->content_tag}, {"user_tag", &a->user_tag},
              {"assistant_tag", &a->assistant_tag}, {"observation_tag", &a->observation_tag},
              {"function_tag", &a->function_tag}, {"system_tag", &a->system_tag}});
}

void join_basics(const Json& entry, const std::string& name, DatasetAttr* attr) {
  std::optional<std::string> text;
  read_optional_string(entry, "formatting", name, &text);
  attr->formatting = text.value_or("alpaca");
  read_optional_string(entry, "split", name, &text);
  attr->split = text.value_or("train");
  if (auto it = entry.find("ranking"); it != entry.end() && !it->is_null()) {
    FAB_USER_CHECK(it->is_boolean(), "{}: expected true or false, got {}", where_in_info(name, "ranking"), it->dump());
    attr->ranking = it->get<bool>();
  }
  if (auto it = entry.find("num_samples"); it != entry.end() && !it->is_null()) {
    FAB_USER_CHECK(it->is_number_integer() && it->get<int64_t>() >= 0, "{}: expected a non-negative integer, got {}",
                   where_in_info(name, "num_samples"), it->dump());
    attr->num_samples = it->get<int64_t>();
  }
  FAB_USER_CHECK(attr->formatting == "alpaca" || attr->formatting == "sharegpt",
                 "{}: '{}' is not supported (expected alpaca or sharegpt)", where_in_info(name, "formatting"),
                 attr->formatting);
}

// Where the data lives, in LLaMA-Factory's order of precedence.
void join_location(const Json& entry, const std::string& name, const std::string& dataset_dir, DatasetAttr* attr) {
  for (const char* remote : {"hf_hub_url", "ms_hub_url", "om_hub_url", "script_url", "cloud_file_name"}) {
    if (entry.contains(remote)) {
      attr->load_from = remote;
      attr->file_name = entry[remote].is_string() ? entry[remote].get<std::string>() : entry[remote].dump();
      return;
    }
  }
  std::optional<std::string> file;
  read_optional_string(entry, "file_name", name, &file);
  FAB_USER_CHECK(file.has_value(), "{}: dataset '{}' needs a file_name (or a hub url)", kDataConfig, name);
  attr->file_name = (fs::path(dataset_dir) / *file).string();  // like os.path.join: absolute names win
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  std::iota(row.begin(), row.end(), 0);
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t next = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = row[j];
      row[j] = next;
    }
  }
  return row[b.size()];
}

std::string did_you_mean(const std::string& name, const Json& info) {
  std::string best;
  size_t best_distance = 4;  // suggest only close names
  for (const auto& [key, value] : info.items()) {
    size_t d = edit_distance(name, key);
    if (d < best_distance) best_distance = d, best = key;
  }
  return best.empty() ? "" : fab::format(" (did you mean '{}'?)", best);
}

// A dataset given as a path rather than a registered name (Fabrica extension).
std::optional<std::string> existing_path(const std::string& name, const std::string& dataset_dir) {
  std::error_code ec;
  for (const fs::path& candidate : {fs::path(name), fs::path(dataset_dir) / name})
    if (fs::exists(candidate, ec)) return candidate.string();
  return std::nullopt;
}

std::optional<Json> read_dataset_info(const std::string& dataset_dir, std::string* error) {
  std::string path = (fs::path(dataset_dir) / kDataConfig).string();
  std::ifstream in(path);
  if (!in.good()) {
    *error = fab::format("cannot open {}", path);
    return std::nullopt;
  }
  try {
    Json info = Json::parse(in);
    FAB_USER_CHECK(info.is_object(), "{}: expected a JSON object of datasets, got {}", path, json_type_name(info));
    return info;
  } catch (const Json::exception& e) {
    throw UserError(fab::format("{}: invalid JSON ({})", path, e.what()));
  }
}

}  // namespace

DatasetAttr parse_dataset_attr(const std::string& name, std::string_view entry_json, const std::string& dataset_dir) {
  Json entry;
  try {
    entry = Json::parse(entry_json);
  } catch (const Json::exception& e) {
    throw UserError(fab::format("{}: dataset '{}': invalid JSON ({})", kDataConfig, name, e.what()));
  }
  FAB_USER_CHECK(entry.is_object(), "{}: dataset '{}': expected an object, got {}", kDataConfig, name,
                 json_type_name(entry));
  DatasetAttr attr;
  attr.name = name;
  join_location(entry, name, dataset_dir, &attr);
  join_basics(entry, name, &attr);
  join_columns(entry, name, &attr);
  return attr;
}

std::vector<DatasetAttr> get_dataset_list(const std::vector<std::string>& names, const std::string& dataset_dir) {
  FAB_USER_CHECK(dataset_dir != "ONLINE" && dataset_dir.rfind("REMOTE:", 0) != 0,
                 "dataset_dir '{}': hub datasets are not supported, use a local folder", dataset_dir);
  std::string info_error;
  std::optional<Json> info = names.empty() ? std::nullopt : read_dataset_info(dataset_dir, &info_error);
  std::vector<DatasetAttr> list;
  for (const std::string& name : names) {
    if (info && info->contains(name)) {
      list.push_back(parse_dataset_attr(name, (*info)[name].dump(), dataset_dir));
    } else if (std::optional<std::string> path = existing_path(name, dataset_dir)) {
      DatasetAttr attr;
      attr.name = name;
      attr.file_name = *path;
      attr.formatting = "auto";  // guessed from the first record when loading
      list.push_back(std::move(attr));
    } else {
      FAB_USER_CHECK(info.has_value(), "{} (needed for dataset '{}')", info_error, name);
      throw UserError(fab::format("undefined dataset '{}' in {}/{}{}", name, dataset_dir, kDataConfig,
                                  did_you_mean(name, *info)));
    }
  }
  return list;
}

}  // namespace fab
