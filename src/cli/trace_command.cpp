// fabrica trace summary OUTPUT_DIR [--json]
#include <cstdio>

#include <nlohmann/json.hpp>

#include "cli/args.h"
#include "cli/commands.h"
#include "core/error.h"
#include "monitor/trace_summary.h"

namespace fab {

int run_trace_summary(int argc, char** argv) {
  Args args(argc, argv, 3, {}, {"json"});
  FAB_USER_CHECK(args.positional().size() == 1, "usage: fabrica trace summary OUTPUT_DIR [--json]");
  const std::vector<RankTimeSummary> ranks = summarize_traces(args.positional()[0]);
  const std::string text = args.flag("json") ? trace_summary_json(ranks).dump(1) + "\n" : trace_summary_text(ranks);
  std::fputs(text.c_str(), stdout);
  return 0;
}

}  // namespace fab
