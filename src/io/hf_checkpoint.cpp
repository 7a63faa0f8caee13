#include "io/hf_checkpoint.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/file_write.h"

namespace fab {
namespace fs = std::filesystem;

namespace {

// What Hugging Face's Trainer saves beside the weights of a checkpoint: not model weights.
bool is_trainer_state(const std::string& name) {
  return name == "training_args.bin" || name == "optimizer.pt" || name == "scheduler.pt" || name == "scaler.pt" ||
         name.rfind("rng_state", 0) == 0;
}

// The folder's files (sorted names) with one of the extensions, trainer state left out.
std::vector<std::string> files_ending(const std::string& folder, std::initializer_list<const char*> extensions) {
  std::vector<std::string> found;
  for (const auto& entry : fs::directory_iterator(folder)) {
    const std::string name = entry.path().filename().string(), extension = entry.path().extension().string();
    for (const char* e : extensions)
      if (entry.is_regular_file() && extension == e && !is_trainer_state(name)) found.push_back(name);
  }
  std::sort(found.begin(), found.end());
  return found;
}

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

// The one-line command that turns the folder's pickle weights into model.safetensors.
std::string conversion_command(const std::string& folder, const std::vector<std::string>& pickles) {
  if (pickles.front().rfind("pytorch_model", 0) == 0)
    return format("python -c \"from transformers import AutoModelForCausalLM as M; M.from_pretrained('{}')."
                  "save_pretrained('{}', safe_serialization=True)\"",
                  folder, folder);
  return format("python -c \"import torch; from safetensors.torch import save_file; save_file({k: v.contiguous()."
                "clone() for k, v in torch.load('{}', map_location='cpu').items()}, '{}')\"",
                (fs::path(folder) / pickles.front()).string(), (fs::path(folder) / "model.safetensors").string());
}

}  // namespace

bool HfWeights::present(const std::string& folder) {
  if (fs::exists(fs::path(folder) / "model.safetensors") || fs::exists(fs::path(folder) / "model.safetensors.index.json"))
    return true;
  if (!fs::is_directory(folder)) return false;
  const std::vector<std::string> shards = files_ending(folder, {".safetensors"});
  FAB_USER_CHECK(shards.empty(),
                 "{}: {} without model.safetensors.index.json: expected model.safetensors, or shards with the "
                 "index that lists their tensors",
                 folder, joined(shards));
  const std::vector<std::string> pickles = files_ending(folder, {".bin", ".pt", ".pth", ".ckpt"});
  FAB_USER_CHECK(pickles.empty(), "{}: {}: pickle checkpoints are not loaded; convert to safetensors: {}", folder,
                 joined(pickles), conversion_command(folder, pickles));
  const std::vector<std::string> others = files_ending(folder, {".gguf", ".h5", ".msgpack", ".onnx"});
  FAB_USER_CHECK(others.empty(), "{}: {}: weights in a format Fabrica does not read; expected model.safetensors",
                 folder, joined(others));
  return false;
}

HfWeights HfWeights::open(const std::string& folder) {
  HfWeights w;
  const fs::path single = fs::path(folder) / "model.safetensors";
  const fs::path index = fs::path(folder) / "model.safetensors.index.json";
  std::vector<std::string> files;
  if (fs::exists(index)) {
    std::ifstream in(index);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
      throw UserError(format("{}: not valid JSON ({})", index.string(), e.what()));
    }
    FAB_USER_CHECK(j.contains("weight_map") && j["weight_map"].is_object(), "{}: missing object \"weight_map\"",
                   index.string());
    std::map<std::string, size_t> file_index;
    for (auto& [name, file] : j["weight_map"].items()) {
      FAB_USER_CHECK(file.is_string(), "{}: weight_map[\"{}\"] must be a file name", index.string(), name);
      const std::string f = file.get<std::string>();
      FAB_USER_CHECK(f.find('/') == std::string::npos && f != ".." && !f.empty(),
                     "{}: weight_map[\"{}\"] = \"{}\" must name a file in the same folder", index.string(), name, f);
      if (!file_index.count(f)) {
        file_index[f] = w.files_.size();
        w.files_.push_back(std::make_shared<SafetensorsFile>(SafetensorsFile::open((fs::path(folder) / f).string())));
      }
      const SafetensorsFile& shard = *w.files_[file_index[f]];
      FAB_USER_CHECK(shard.contains(name), "{}: lists \"{}\" in {}, which does not contain it", index.string(), name, f);
      w.where_[name] = file_index[f];
    }
  } else {
    FAB_USER_CHECK(fs::exists(single), "{}: no model.safetensors or model.safetensors.index.json", folder);
    w.files_.push_back(std::make_shared<SafetensorsFile>(SafetensorsFile::open(single.string())));
    for (const std::string& name : w.files_[0]->names()) w.where_[name] = 0;
  }
  return w;
}

std::vector<std::string> HfWeights::names() const {
  std::vector<std::string> out;
  for (auto& [name, i] : where_) out.push_back(name);
  return out;
}

const SafetensorsFile& HfWeights::file_of(const std::string& name) const {
  auto it = where_.find(name);
  FAB_USER_CHECK(it != where_.end(), "no tensor named \"{}\" in the weights", name);
  return *files_[it->second];
}

void save_hf_weights(const std::string& folder, const std::vector<NamedTensor>& tensors, size_t max_shard_bytes) {
  fs::create_directories(folder);
  std::vector<std::vector<NamedTensor>> shards(1);
  size_t shard_bytes = 0, total = 0;
  for (const NamedTensor& t : tensors) {
    if (shard_bytes > 0 && shard_bytes + t.tensor.bytes() > max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(t);
    shard_bytes += t.tensor.bytes();
    total += t.tensor.bytes();
  }
  const std::map<std::string, std::string> metadata = {{"format", "pt"}};
  if (shards.size() == 1) {
    save_safetensors((fs::path(folder) / "model.safetensors").string(), tensors, metadata);
    return;
  }
  nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", nlohmann::json::object()}};
  for (size_t i = 0; i < shards.size(); ++i) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", i + 1, shards.size());
    save_safetensors((fs::path(folder) / name).string(), shards[i], metadata);
    for (const NamedTensor& t : shards[i]) index["weight_map"][t.name] = name;
  }
  write_file_atomically((fs::path(folder) / "model.safetensors.index.json").string(), index.dump(2) + "\n");
}

}  // namespace fab
