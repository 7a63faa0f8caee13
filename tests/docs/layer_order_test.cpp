// The layer order of src/, written once: a folder includes only folders on lower levels (and
// itself). Every #include "folder/..." of src/ is checked against it, and every folder of src/
// must have its level, so a new folder is placed on purpose.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <vector>

namespace fab {
namespace {
namespace fs = std::filesystem;

// Lowest first. Why config/ sits above models/ and optim/: it validates lr_scheduler_type with
// optim/lr_schedule.h, and nothing below dataset/ reads a TrainConfig (models/ take DecoderOptions).
const std::vector<std::vector<std::string>> kLayers = {
    {"core"},                                               // tensors, devices, errors, files, the Backend
    {"autograd", "image", "io", "kernels", "monitor", "tokenizer"},  // each on core alone
    {"comm"},                                               // collectives
    {"nn"},                                                 // differentiable ops (expert parallel's exchange: comm)
    {"models"},                                             // DecoderModel, DecoderLayer, weights
    {"optim"},                                              // AdamW over a ParamBuffer, LR schedules
    {"config"},                                             // TrainConfig, the YAML loader
    {"dataset", "infer", "parallel"},                       // data; generation; the parallel model
    {"launch", "plan", "train"},                            // launcher; planner; Trainer and stages
    {"cli"},                                                // the commands: the composition root
};

std::map<std::string, size_t> level_of_folder() {
  std::map<std::string, size_t> level;
  for (size_t i = 0; i < kLayers.size(); ++i)
    for (const std::string& folder : kLayers[i]) level[folder] = i;
  return level;
}

TEST(LayerOrder, EveryFolderOfSrcHasALevel) {
  const std::map<std::string, size_t> level = level_of_folder();
  size_t folders = 0;
  for (const auto& e : fs::directory_iterator(fs::path(FAB_SOURCE_DIR) / "src")) {
    if (!e.is_directory()) continue;
    ++folders;
    EXPECT_TRUE(level.count(e.path().filename().string()))
        << "src/" << e.path().filename().string() << "/ has no place in the layer order (tests/docs/layer_order_test.cpp)";
  }
  EXPECT_EQ(folders, level.size()) << "the layer order names a folder src/ does not have";
}

TEST(LayerOrder, NoFolderIncludesALayerAboveOrBesideIt) {
  const std::map<std::string, size_t> level = level_of_folder();
  const std::regex include(R"(^\s*#\s*include\s*"([a-z_]+)/)");
  const fs::path src = fs::path(FAB_SOURCE_DIR) / "src";
  size_t checked = 0;
  for (const auto& e : fs::recursive_directory_iterator(src)) {
    if (!e.is_regular_file()) continue;
    const fs::path relative = fs::relative(e.path(), src);
    if (relative.begin() == relative.end() || std::next(relative.begin()) == relative.end()) continue;  // main.cpp
    const std::string folder = relative.begin()->string();
    if (!level.count(folder)) continue;  // EveryFolderOfSrcHasALevel reports it
    std::ifstream in(e.path());
    std::string line;
    for (int number = 1; std::getline(in, line); ++number) {
      std::smatch m;
      if (!std::regex_search(line, m, include) || !level.count(m[1].str()) || m[1].str() == folder) continue;
      ++checked;
      EXPECT_LT(level.at(m[1].str()), level.at(folder))
          << "src/" << relative.string() << ":" << number << " includes " << m[1].str() << "/, which is not below "
          << folder << "/ in the layer order";
    }
  }
  EXPECT_GT(checked, 100u);  // the scan found the includes
}

}  // namespace
}  // namespace fab
