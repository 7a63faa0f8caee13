#include "monitor/progress_bar.h"

#include <gtest/gtest.h>

#include <cmath>

namespace fab {
namespace {

TEST(ProgressBar, EtaInSecondsMinutesOrHours) {
  EXPECT_EQ(eta_text(0), "0s");
  EXPECT_EQ(eta_text(42.4), "42s");
  EXPECT_EQ(eta_text(59.6), "1m00s");
  EXPECT_EQ(eta_text(187), "3m07s");
  EXPECT_EQ(eta_text(7500), "2h05m");
  EXPECT_EQ(eta_text(NAN), "?");
  EXPECT_EQ(eta_text(-1), "?");
}

TEST(ProgressBar, LineHasTheBarTheNumbersAndTheEta) {
  Progress p;
  p.step = 25, p.total_steps = 100, p.first_step = 0;
  p.loss = 2.34567, p.lr = 1e-3, p.tokens_per_s = 4096.4, p.mfu = 0.414, p.elapsed_s = 20;
  // 25 steps in 20 s: 75 to go at 0.8 s each.
  EXPECT_EQ(progress_line(p, 8), "25/100 [##      ] loss 2.3457 lr 1.00e-03 tok/s 4096 MFU 41% ETA 1m00s");
}

TEST(ProgressBar, EtaCountsOnlyTheStepsOfThisRun) {
  Progress p;
  p.step = 60, p.total_steps = 100, p.first_step = 50, p.elapsed_s = 5;  // resumed at 50: 0.5 s a step
  EXPECT_NE(progress_line(p, 4).find("ETA 20s"), std::string::npos) << progress_line(p, 4);
  p.step = 50;  // nothing timed yet
  EXPECT_NE(progress_line(p, 4).find("ETA ?"), std::string::npos);
}

TEST(ProgressBar, FullAtTheEndAndNeverPastIt) {
  Progress p;
  p.step = 100, p.total_steps = 100, p.first_step = 0, p.elapsed_s = 10;
  EXPECT_EQ(progress_line(p, 4).substr(0, 14), "100/100 [####]");
  p.step = 120;  // never more than the bar's width
  EXPECT_EQ(progress_line(p, 4).substr(0, 14), "120/100 [####]");
}

}  // namespace
}  // namespace fab
