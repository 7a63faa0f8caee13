#pragma once
// plot_loss: the training-loss curve (raw and smoothed, as LLaMA-Factory's plot) as an SVG image.
#include <string>
#include <vector>

namespace fab {

void write_loss_plot(const std::string& path, const std::vector<double>& steps, const std::vector<double>& losses,
                     const std::string& title);

}  // namespace fab
