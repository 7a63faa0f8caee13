#include <gtest/gtest.h>

#include <fstream>

#include "config/yaml_file.h"
#include "core/error.h"
#include "test_util.h"

namespace fab {
namespace {

std::string error_of(const std::string& path) {
  try {
    load_yaml_file(path, "a file of settings");
  } catch (const UserError& e) {
    return e.what();
  }
  return "accepted";
}

TEST(YamlFile, EveryFailureNamesTheFileAndWhatWasExpected) {
  const std::string dir = test::fresh_dir("yaml-file");
  EXPECT_EQ(error_of(dir), dir + ": is a folder; expected a file of settings");
  EXPECT_EQ(error_of(dir + "/missing.yaml"),
            dir + "/missing.yaml: cannot open (No such file or directory); expected a file of settings");
  std::ofstream(dir + "/bad.yaml") << "a: 1\nb: [2\n";
  EXPECT_EQ(error_of(dir + "/bad.yaml").rfind(dir + "/bad.yaml:3:1: not valid YAML (", 0), 0u)
      << error_of(dir + "/bad.yaml");
  std::ofstream(dir + "/good.yaml") << "a: 1\nb: [2, 3]\n";
  const YAML::Node good = load_yaml_file(dir + "/good.yaml", "a file of settings");
  EXPECT_EQ(good["a"].as<int>(), 1);
  EXPECT_EQ(good["b"][1].as<int>(), 3);
  std::ofstream(dir + "/empty.yaml") << "# only a comment\n";
  EXPECT_TRUE(load_yaml_file(dir + "/empty.yaml", "a file of settings").IsNull());
}

TEST(YamlFile, TextIsNamedByItsSource) {
  EXPECT_EQ(parse_yaml("x: 4", "inline")["x"].as<int>(), 4);
  try {
    parse_yaml("x: 1\ny: {\n", "inline");
    ADD_FAILURE() << "accepted";
  } catch (const UserError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("inline:3:1: not valid YAML (", 0), 0u) << e.what();
  }
}

}  // namespace
}  // namespace fab
