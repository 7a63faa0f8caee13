#pragma once
// The training stage (the `stage` key), parsed once when the config is read. The layers that only
// need to know what a stage's data or training looks like ask the questions below; train/stages/
// holds each stage's own code.
#include <optional>
#include <ostream>
#include <string_view>

namespace fab {

enum class Stage { pt, sft, rm, dpo, kto, grpo, ppo };

// LLaMA-Factory's names: pt, sft, rm, dpo, kto; and grpo, ppo (verl's). nullopt for any other.
std::optional<Stage> parse_stage(std::string_view name);
const char* stage_name(Stage stage);
inline std::ostream& operator<<(std::ostream& out, Stage stage) { return out << stage_name(stage); }

// dpo, kto, rm: items of two sequences (chosen and rejected; kto's example and the mismatched
// completion of its KL term), a loss per item.
bool is_preference(Stage stage);
// grpo, ppo: the data are prompts; each step samples responses and scores them.
bool is_rollout(Stage stage);

}  // namespace fab
