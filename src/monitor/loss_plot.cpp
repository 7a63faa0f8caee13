#include "monitor/loss_plot.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "core/error.h"
#include "core/file_write.h"

namespace fab {
namespace {

// Exponential moving average with LLaMA-Factory's weight: 1.8 * (1/(1+e^(-0.05 n)) - 0.5).
std::vector<double> smooth(const std::vector<double>& y) {
  if (y.empty()) return y;
  const double weight = 1.8 * (1.0 / (1.0 + std::exp(-0.05 * double(y.size()))) - 0.5);
  std::vector<double> out{y[0]};
  for (size_t i = 1; i < y.size(); ++i) out.push_back(out.back() * weight + (1 - weight) * y[i]);
  return out;
}

std::string polyline(const std::vector<double>& x, const std::vector<double>& y, double x0, double x1, double y0,
                     double y1, const char* color, double width) {
  std::ostringstream s;
  s << "<polyline fill=\"none\" stroke=\"" << color << "\" stroke-width=\"" << width << "\" points=\"";
  for (size_t i = 0; i < x.size(); ++i)
    s << 70 + 540 * (x[i] - x0) / std::max(1e-12, x1 - x0) << "," << 340 - 290 * (y[i] - y0) / std::max(1e-12, y1 - y0)
      << " ";
  s << "\"/>\n";
  return s.str();
}

}  // namespace

void write_loss_plot(const std::string& path, const std::vector<double>& steps, const std::vector<double>& losses,
                     const std::string& title) {
  if (losses.empty()) return;
  const double x0 = steps.front(), x1 = steps.back();
  const double y0 = *std::min_element(losses.begin(), losses.end()), y1 = *std::max_element(losses.begin(), losses.end());
  std::ostringstream svg;
  svg << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"640\" height=\"400\" font-family=\"sans-serif\" "
         "font-size=\"12\">\n<rect width=\"640\" height=\"400\" fill=\"white\"/>\n"
      << "<text x=\"320\" y=\"25\" text-anchor=\"middle\" font-size=\"15\">" << title << "</text>\n"
      << "<line x1=\"70\" y1=\"340\" x2=\"610\" y2=\"340\" stroke=\"black\"/>\n"
      << "<line x1=\"70\" y1=\"50\" x2=\"70\" y2=\"340\" stroke=\"black\"/>\n";
  for (int i = 0; i <= 4; ++i) {  // axis ticks with values
    const double fy = y0 + (y1 - y0) * i / 4, fx = x0 + (x1 - x0) * i / 4;
    svg << "<text x=\"64\" y=\"" << 344 - 72.5 * i << "\" text-anchor=\"end\">" << std::round(fy * 1000) / 1000
        << "</text>\n<text x=\"" << 70 + 135 * i << "\" y=\"358\" text-anchor=\"middle\">" << std::llround(fx)
        << "</text>\n";
  }
  svg << "<text x=\"340\" y=\"385\" text-anchor=\"middle\">step</text>\n"
      << "<text x=\"18\" y=\"195\" transform=\"rotate(-90 18 195)\" text-anchor=\"middle\">loss</text>\n"
      << polyline(steps, losses, x0, x1, y0, y1, "#9ecae1", 1.5)
      << polyline(steps, smooth(losses), x0, x1, y0, y1, "#08519c", 2.0) << "</svg>\n";
  write_file_atomically(path, svg.str());
}

}  // namespace fab
