#include "monitor/progress_bar.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace fab {

std::string eta_text(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const int64_t s = std::llround(seconds);
  char text[32];
  if (s < 60)
    std::snprintf(text, sizeof text, "%llds", (long long)s);
  else if (s < 3600)
    std::snprintf(text, sizeof text, "%lldm%02llds", (long long)(s / 60), (long long)(s % 60));
  else
    std::snprintf(text, sizeof text, "%lldh%02lldm", (long long)(s / 3600), (long long)(s % 3600 / 60));
  return text;
}

std::string progress_line(const Progress& p, int width) {
  const double done = p.total_steps > 0 ? double(p.step) / double(p.total_steps) : 1.0;
  const int filled = std::clamp(int(width * done), 0, width);
  const int64_t timed = p.step - p.first_step;
  const double eta = timed > 0 ? p.elapsed_s / double(timed) * double(p.total_steps - p.step) : NAN;
  char numbers[160];
  std::snprintf(numbers, sizeof numbers, "] loss %.4f lr %.2e tok/s %.0f MFU %.0f%% ETA ", p.loss, p.lr,
                p.tokens_per_s, 100 * p.mfu);
  return std::to_string(p.step) + "/" + std::to_string(p.total_steps) + " [" + std::string(size_t(filled), '#') +
         std::string(size_t(width - filled), ' ') + numbers + eta_text(eta);
}

}  // namespace fab
