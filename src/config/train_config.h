#pragma once
// A `fabrica train` configuration: YAML with LLaMA-Factory's keys, plus key=value overrides.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "config/config_keys.h"
#include "config/stage.h"
#include "core/parse_bool.h"  // parse_bool: every boolean setting

namespace fab {

struct TrainConfig {
#define FAB_CONFIG_FIELD(key, field, type, def, status, doc) type field = def;
  FAB_CONFIG_KEYS(FAB_CONFIG_FIELD)
#undef FAB_CONFIG_FIELD
  // Keys that were given but have no effect here (status Accepted), for the one-line note.
  std::vector<std::string> accepted_keys;
  // Every key the YAML or an override set (canonical names), e.g. for `parallel: auto`, whose
  // search the layout keys set by hand constrain.
  std::vector<std::string> given_keys;
};

// Parses YAML text (`source` names it in messages), then applies `overrides` ("key=value", the
// value read as YAML). Unknown keys fail with a did-you-mean; keys of features not implemented yet
// fail saying so; wrong types name the key and the expected type. All problems are reported in
// one UserError.
TrainConfig parse_train_config(const std::string& yaml_text, const std::string& source,
                               const std::vector<std::string>& overrides = {});
TrainConfig load_train_config(const std::string& path, const std::vector<std::string>& overrides = {});

// The name among `names` nearest to `word` (fewer than 4 edits away), or "": a did-you-mean hint.
std::string nearest_name(const std::string& word, const std::vector<std::string>& names);

// Every key with its resolved value, as YAML (written to output_dir and into checkpoints).
std::string train_config_to_yaml(const TrainConfig& config);
// docs/CONFIG.md, generated from the schema.
std::string config_reference_markdown();

}  // namespace fab
