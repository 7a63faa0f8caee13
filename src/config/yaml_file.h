#pragma once
// The one reading of a YAML document a user (or an earlier run) wrote: training configs, export
// YAMLs, cluster files, plan cluster specs, a checkpoint's train_config.yaml. Every failure is a
// UserError that names the file: the CLI prints it on one line and exits 2.
#include <string>

#include <yaml-cpp/yaml.h>

namespace fab {

// `text` parsed; `source` names it in messages. Invalid YAML:
// "<source>:<line>:<column>: not valid YAML (<yaml-cpp's reason>)".
YAML::Node parse_yaml(const std::string& text, const std::string& source);

// The YAML file at `path`, parsed as parse_yaml does. A folder ("<path>: is a folder; expected
// <expected>") or a file that cannot be opened ("<path>: cannot open (<reason>); expected
// <expected>") is a UserError too; `expected` says what the file should be ("a cluster file ...").
YAML::Node load_yaml_file(const std::string& path, const std::string& expected);

}  // namespace fab
