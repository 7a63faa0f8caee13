#include "monitor/metrics_log.h"

#include <filesystem>

namespace fab {

namespace {

std::string metrics_path(const std::string& output_dir) {
  std::filesystem::create_directories(output_dir);
  return output_dir + "/metrics.jsonl";
}

}  // namespace

MetricsLog::MetricsLog(const std::string& output_dir, bool append) : file_(metrics_path(output_dir), append) {}

void MetricsLog::write(const std::string& json_line) { file_.append_line(json_line); }

}  // namespace fab
