#pragma once
// The LLaMA-Factory parity fixture (tests/dataset/fixtures/template_parity.json, written by
// tests/dataset/template_reference.py) and helpers to compare against it.
#include <gtest/gtest.h>

#include <sstream>

#include "dataset/dataset.h"
#include "template_test_support.h"

namespace fab::test {

inline const nlohmann::json& parity_fixture() {
  static const nlohmann::json fixture = read_json_file(fixture_dir() / "template_parity.json");
  return fixture;
}

inline std::vector<int32_t> fixture_sequence(size_t index) {
  return parity_fixture().at("sequences").at(index).get<std::vector<int32_t>>();
}

inline Role role_from_name(const std::string& name) {
  for (Role r : {Role::user, Role::assistant, Role::system, Role::function, Role::observation})
    if (role_name(r) == name) return r;
  throw std::runtime_error("unknown role " + name);
}

inline std::vector<Message> messages_from_json(const nlohmann::json& list) {
  std::vector<Message> out;
  for (const auto& m : list) out.push_back({role_from_name(m.at("role")), m.at("content")});
  return out;
}

// The example as LLaMA-Factory aligned it.
inline Example fixture_example(const nlohmann::json& e) {
  Example ex;
  ex.prompt = messages_from_json(e.at("prompt"));
  ex.response = messages_from_json(e.at("response"));
  ex.system = e.at("system");
  ex.tools = e.at("tools");
  return ex;
}

// The dataset folder a fixture entry names: the shared LLaMA-Factory data or our fixture data.
inline std::string fixture_dataset_dir(const nlohmann::json& entry) {
  return entry.at("dir") == "shared" ? llamafactory_dir() : (fixture_dir() / "lf_data").string();
}

// "" when equal, else where and how they differ.
inline std::string diff_ids(const std::vector<int32_t>& got, const std::vector<int32_t>& want) {
  if (got == want) return "";
  size_t i = 0;
  while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
  std::ostringstream out;
  out << "lengths " << got.size() << " vs " << want.size() << ", first difference at " << i << ": got";
  for (size_t j = i; j < got.size() && j < i + 6; ++j) out << ' ' << got[j];
  out << " / want";
  for (size_t j = i; j < want.size() && j < i + 6; ++j) out << ' ' << want[j];
  return out.str();
}

}  // namespace fab::test
