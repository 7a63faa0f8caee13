#include "config/stage.h"

#include <array>
#include <utility>

namespace fab {
namespace {

constexpr std::array<std::pair<Stage, const char*>, 7> kNames{{{Stage::pt, "pt"},
                                                               {Stage::sft, "sft"},
                                                               {Stage::rm, "rm"},
                                                               {Stage::dpo, "dpo"},
                                                               {Stage::kto, "kto"},
                                                               {Stage::grpo, "grpo"},
                                                               {Stage::ppo, "ppo"}}};

}  // namespace

std::optional<Stage> parse_stage(std::string_view name) {
  for (const auto& [stage, text] : kNames)
    if (name == text) return stage;
  return std::nullopt;
}

const char* stage_name(Stage stage) {
  for (const auto& [s, text] : kNames)
    if (s == stage) return text;
  return "?";
}

bool is_preference(Stage stage) { return stage == Stage::dpo || stage == Stage::kto || stage == Stage::rm; }

bool is_rollout(Stage stage) { return stage == Stage::grpo || stage == Stage::ppo; }

}  // namespace fab
