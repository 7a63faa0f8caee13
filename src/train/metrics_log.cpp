#include "train/metrics_log.h"

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace fab {

MetricsLog::MetricsLog(const std::string& output_dir, bool append) {
  std::filesystem::create_directories(output_dir);
  const std::string path = output_dir + "/metrics.jsonl";
  file_ = std::fopen(path.c_str(), append ? "a" : "w");
  FAB_USER_CHECK(file_, "{}: cannot open for writing ({})", path, std::strerror(errno));
}

MetricsLog::~MetricsLog() { std::fclose(file_); }

void MetricsLog::write(const std::string& json_line) {
  std::fputs(json_line.c_str(), file_);
  std::fputc('\n', file_);
  std::fflush(file_);
}

}  // namespace fab
