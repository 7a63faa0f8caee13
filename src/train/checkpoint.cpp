#include "train/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/hf_checkpoint.h"
#include "models/hf_model.h"

namespace fab {
namespace fs = std::filesystem;

namespace {

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  FAB_USER_CHECK(out.good(), "{}: write failed", path.string());
}

void fsync_path(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

int64_t step_of(const fs::path& p) {
  const std::string name = p.filename().string();
  if (name.rfind("checkpoint-", 0) != 0) return -1;
  const std::string digits = name.substr(11);
  if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) return -1;
  return std::stoll(digits);
}

std::vector<fs::path> checkpoints_by_step(const std::string& output_dir) {
  std::vector<fs::path> found;
  if (!fs::exists(output_dir)) return found;
  for (const auto& e : fs::directory_iterator(output_dir))
    if (e.is_directory() && step_of(e.path()) >= 0) found.push_back(e.path());
  std::sort(found.begin(), found.end(), [](const fs::path& a, const fs::path& b) { return step_of(a) < step_of(b); });
  return found;
}

}  // namespace

void save_checkpoint(const std::string& dir, const DecoderModel& model, const AdamW& optimizer,
                     const TrainerState& state, const std::string& config_yaml) {
  const fs::path final_dir(dir);
  const fs::path tmp = final_dir.string() + ".tmp";
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  save_model_folder(model, tmp.string());
  save_safetensors((tmp / "optimizer.safetensors").string(),
                   {{"exp_avg", optimizer.exp_avg()}, {"exp_avg_sq", optimizer.exp_avg_sq()}},
                   {{"step", std::to_string(optimizer.steps_taken())}});
  nlohmann::json j = {{"global_step", state.global_step},
                      {"sampler_epoch", state.sampler.epoch},
                      {"sampler_position", state.sampler.position},
                      {"losses", state.losses}};
  write_text(tmp / "trainer_state.json", j.dump(1) + "\n");
  write_text(tmp / "train_config.yaml", config_yaml);
  for (const auto& e : fs::directory_iterator(tmp)) fsync_path(e.path());
  fsync_path(tmp);
  fs::remove_all(final_dir);
  fs::rename(tmp, final_dir);
  fsync_path(final_dir.parent_path().empty() ? fs::path(".") : final_dir.parent_path());
}

TrainerState load_checkpoint(const std::string& dir, DecoderModel& model, AdamW& optimizer) {
  FAB_USER_CHECK(fs::exists(fs::path(dir) / "trainer_state.json"), "{}: not a Fabrica checkpoint (no trainer_state.json)",
                 dir);
  load_weights(model, HfWeights::open(dir));
  SafetensorsFile opt = SafetensorsFile::open((fs::path(dir) / "optimizer.safetensors").string());
  for (auto [name, dst] : {std::pair{"exp_avg", &optimizer.exp_avg()}, std::pair{"exp_avg_sq", &optimizer.exp_avg_sq()}}) {
    Tensor src = opt.tensor(name);
    FAB_USER_CHECK(src.numel() == dst->numel(), "{}: optimizer state {} has {} values, the model needs {}", dir, name,
                   src.numel(), dst->numel());
    dst->copy_from(src);
  }
  optimizer.set_steps_taken(std::stoll(opt.metadata().at("step")));
  std::ifstream in(fs::path(dir) / "trainer_state.json");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
    TrainerState s;
    s.global_step = j.at("global_step").get<int64_t>();
    s.sampler.epoch = j.at("sampler_epoch").get<int64_t>();
    s.sampler.position = j.at("sampler_position").get<int64_t>();
    s.losses = j.at("losses").get<std::vector<double>>();
    return s;
  } catch (const nlohmann::json::exception& e) {
    throw UserError(format("{}/trainer_state.json: {}", dir, e.what()));
  }
}

std::string latest_checkpoint(const std::string& output_dir) {
  auto found = checkpoints_by_step(output_dir);
  return found.empty() ? "" : found.back().string();
}

void prune_checkpoints(const std::string& output_dir, int64_t keep) {
  if (keep <= 0) return;
  auto found = checkpoints_by_step(output_dir);
  for (size_t i = 0; i + size_t(keep) < found.size(); ++i) fs::remove_all(found[i]);
}

}  // namespace fab
