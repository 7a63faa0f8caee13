#include "config/yaml_file.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace fab {

YAML::Node parse_yaml(const std::string& text, const std::string& source) {
  try {
    return YAML::Load(text);
  } catch (const YAML::ParserException& e) {
    throw UserError(format("{}:{}:{}: not valid YAML ({})", source, e.mark.line + 1, e.mark.column + 1, e.msg));
  } catch (const YAML::Exception& e) {
    throw UserError(format("{}: not valid YAML ({})", source, e.what()));
  }
}

YAML::Node load_yaml_file(const std::string& path, const std::string& expected) {
  std::error_code error;
  FAB_USER_CHECK(!std::filesystem::is_directory(path, error), "{}: is a folder; expected {}", path, expected);
  errno = 0;
  std::ifstream in(path);
  FAB_USER_CHECK(in, "{}: cannot open ({}); expected {}", path, std::strerror(errno ? errno : ENOENT), expected);
  std::stringstream text;
  text << in.rdbuf();
  FAB_USER_CHECK(!in.bad(), "{}: cannot read; expected {}", path, expected);
  return parse_yaml(text.str(), path);
}

}  // namespace fab
