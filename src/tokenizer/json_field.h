#pragma once
// Reading Hugging Face JSON files (tokenizer.json, tokenizer_config.json) with errors that name
// the file and the field: "<file>: <field>: <what>".
#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>
#include <string>
#include <string_view>

#include "core/error.h"

namespace fab::tok {

using nlohmann::json;

// A JSON value with its path in the file, for error messages.
class Field {
 public:
  Field(const json& value, std::string path, const std::string& file) : value_(value), path_(std::move(path)), file_(file) {}

  [[noreturn]] void fail(const std::string& message) const {
    throw UserError(format("{}: {}: {}", file_, path_.empty() ? "(top level)" : path_, message));
  }
  const json& value() const { return value_; }
  bool is_null() const { return value_.is_null(); }
  bool has(const char* key) const { return value_.is_object() && value_.contains(key) && !value_[key].is_null(); }

  Field operator[](const char* key) const {
    if (!value_.is_object()) fail("expected an object");
    if (!value_.contains(key)) Field(value_, child_path(key), file_).fail("missing");
    return Field(value_[key], child_path(key), file_);
  }
  Field at(size_t i) const { return Field(value_[i], path_ + "[" + std::to_string(i) + "]", file_); }
  size_t size() const {
    if (!value_.is_array()) fail("expected an array");
    return value_.size();
  }

  std::string str() const {
    if (!value_.is_string()) fail("expected a string");
    return value_.get<std::string>();
  }
  bool boolean() const {
    if (!value_.is_boolean()) fail("expected true or false");
    return value_.get<bool>();
  }
  int64_t integer() const {
    if (!value_.is_number_integer()) fail("expected an integer");
    return value_.get<int64_t>();
  }
  // Optional members: absent or null gives the default.
  bool boolean_or(const char* key, bool fallback) const { return has(key) ? (*this)[key].boolean() : fallback; }
  std::string str_or(const char* key, const std::string& fallback) const {
    return has(key) ? (*this)[key].str() : fallback;
  }
  std::string type() const { return (*this)["type"].str(); }

 private:
  std::string child_path(const char* key) const { return path_.empty() ? key : path_ + "." + key; }

  const json& value_;
  std::string path_;
  const std::string& file_;
};

// Runs fn(); a UserError it throws is reported at `field` (components report without the file).
template <typename Fn>
auto with_field(const Field& field, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const UserError& e) {
    field.fail(e.what());
  }
}

inline std::string read_file(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError(format("cannot read {} {}", what, path));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

inline json parse_json(std::string_view text, const std::string& source) {
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    throw UserError(format("{}: not valid JSON ({})", source, e.what()));
  }
}

}  // namespace fab::tok
