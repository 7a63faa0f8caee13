#pragma once
// Where a run reports: one JSON object per logged step in output_dir/metrics.jsonl, and one plain
// line per logged step on stdout (a terminal progress display comes with the CLI).
#include <cstdio>
#include <string>

namespace fab {

class MetricsLog {
 public:
  MetricsLog(const std::string& output_dir, bool append);
  ~MetricsLog();
  void write(const std::string& json_line);

 private:
  std::FILE* file_;
};

}  // namespace fab
