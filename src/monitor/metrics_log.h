#pragma once
// Where a run reports: one JSON object per logged step in output_dir/metrics.jsonl, and one plain
// line per logged step on stdout (a terminal progress display comes with the CLI).
#include <string>

#include "core/file_write.h"

namespace fab {

class MetricsLog {
 public:
  MetricsLog(const std::string& output_dir, bool append);
  // One line, written whole or not at all; a failed write is a UserError (the disk is full, ...).
  void write(const std::string& json_line);

 private:
  AppendFile file_;
};

}  // namespace fab
