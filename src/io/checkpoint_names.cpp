#include "io/checkpoint_names.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/parse_bool.h"

namespace fab {
namespace fs = std::filesystem;

std::string checkpoint_name(int64_t step) { return "checkpoint-" + std::to_string(step); }

int64_t checkpoint_step(const std::string& dir) {
  const std::string name = fs::path(dir).filename().string();
  if (name.rfind("checkpoint-", 0) != 0) return -1;
  const std::string digits = name.substr(11);
  if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) return -1;
  return std::stoll(digits);
}

std::vector<std::string> checkpoints_by_step(const std::string& output_dir) {
  std::vector<std::string> found;
  if (!fs::exists(output_dir)) return found;
  for (const auto& e : fs::directory_iterator(output_dir))
    if (e.is_directory() && checkpoint_step(e.path().string()) >= 0) found.push_back(e.path().string());
  std::sort(found.begin(), found.end(),
            [](const std::string& a, const std::string& b) { return checkpoint_step(a) < checkpoint_step(b); });
  return found;
}

std::string latest_checkpoint(const std::string& output_dir) {
  const std::vector<std::string> found = checkpoints_by_step(output_dir);
  return found.empty() ? "" : found.back();
}

void prune_checkpoints(const std::string& output_dir, int64_t keep) {
  if (keep <= 0) return;
  const std::vector<std::string> found = checkpoints_by_step(output_dir);
  for (size_t i = 0; i + size_t(keep) < found.size(); ++i) fs::remove_all(found[i]);
}

void check_resumable(const std::string& dir) {
  std::ifstream in(fs::path(dir) / "trainer_state.json");
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  const bool model_only = j.is_object() && j.value("save_only_model", false) == true;
  FAB_USER_CHECK(!model_only,
                 "resume_from_checkpoint: {} was saved with save_only_model: true: it holds the weights but no "
                 "optimizer state, so the run cannot resume from it. Export its weights (fabrica export "
                 "--checkpoint {} --output DIR) to start a new run from them, or save resumable checkpoints with "
                 "save_only_model: false",
                 dir, dir);
}

std::string checkpoint_to_resume(const std::string& resume_from_checkpoint, const std::string& output_dir) {
  const std::string& value = resume_from_checkpoint;
  const std::optional<bool> flag = parse_bool(value);
  if (value.empty() || flag == false) return "";
  if (flag == true) {
    const std::string latest = latest_checkpoint(output_dir);
    FAB_USER_CHECK(!latest.empty(),
                   "resume_from_checkpoint: true: no valid checkpoint found in output_dir {} (no checkpoint-N folder)",
                   output_dir);
    check_resumable(latest);
    return latest;
  }
  FAB_USER_CHECK(fs::exists(fs::path(value) / "trainer_state.json"),
                 "resume_from_checkpoint: {}: not a Fabrica checkpoint (expected a checkpoint-N folder with "
                 "trainer_state.json)",
                 value);
  check_resumable(value);
  return value;
}

}  // namespace fab
