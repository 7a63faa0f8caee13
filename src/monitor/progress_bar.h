#pragma once
// The live progress line `fabrica train` redraws on a terminal (stdout a tty) after each step:
//   12/100 [##                      ] loss 2.3456 lr 1.00e-03 tok/s 4096 MFU 41% ETA 1m05s
// The ETA extrapolates this run's pace (steps since it started or resumed) to the remaining steps.
// Off a terminal nothing is drawn and the step lines stay as they are.
#include <cstdint>
#include <string>

namespace fab {

struct Progress {
  int64_t step = 0, total_steps = 0;
  int64_t first_step = 0;  // the step this run started (or resumed) from
  double loss = 0, lr = 0, tokens_per_s = 0, mfu = 0;  // mfu as a fraction
  double elapsed_s = 0;                                // since the run started
};

// "42s", "3m07s", "2h05m"; "?" before any step was timed.
std::string eta_text(double seconds);
// The line, without the carriage return that redraws it; the bar `width` characters wide.
std::string progress_line(const Progress& p, int width = 24);

}  // namespace fab
