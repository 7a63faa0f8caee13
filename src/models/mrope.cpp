#include "models/mrope.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "nn/vision_ops.h"

namespace fab {

std::vector<int64_t> mrope_positions(const ModelConfig& c, const Tensor& ids, const Tensor& grid_thw,
                                     const Tensor& sample_positions) {
  FAB_CHECK(c.vision.has_value(), "M-RoPE positions of a model without a vision tower");
  const int64_t batch = ids.dim(0), seq = ids.dim(1), rows = batch * seq, s = c.vision->spatial_merge_size;
  const int64_t images = grid_thw.defined() ? grid_thw.dim(0) : 0;
  std::vector<int64_t> out(size_t(3 * rows));
  int64_t image = 0;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t* row = ids.data<int64_t>() + b * seq;
    int64_t next = 0;  // the next text position: the largest so far + 1
    const int64_t* starts = sample_positions.defined() ? sample_positions.data<int64_t>() + b * seq : nullptr;
    for (int64_t t = 0; t < seq;) {
      if (starts && starts[t] == 0) next = 0;  // a packed sample begins
      if (row[t] != c.image_token_id) {
        for (int64_t axis = 0; axis < 3; ++axis) out[size_t(axis * rows + b * seq + t)] = next;
        ++next, ++t;
        continue;
      }
      FAB_USER_CHECK(image < images, "the batch has more runs of image tokens (id {}) than its {} images",
                     c.image_token_id, images);
      const int64_t* g = grid_thw.data<int64_t>() + 3 * image;
      const int64_t gt = g[0], gh = g[1] / s, gw = g[2] / s, tokens = gt * gh * gw;
      int64_t run = 0;
      while (t + run < seq && row[t + run] == c.image_token_id) ++run;
      FAB_USER_CHECK(run == tokens,
                     "row {}: image {} ({} x {} x {} patches) needs {} image tokens in a row, the row has {} at "
                     "position {}",
                     b, image, g[0], g[1], g[2], tokens, run, t);
      for (int64_t i = 0; i < tokens; ++i) {
        const int64_t at = b * seq + t + i;
        out[size_t(at)] = next + i / (gh * gw);
        out[size_t(rows + at)] = next + (i / gw) % gh;
        out[size_t(2 * rows + at)] = next + i % gw;
      }
      next += std::max({gt, gh, gw});
      t += tokens;
      ++image;
    }
  }
  FAB_USER_CHECK(image == images, "the batch has {} images but image tokens (id {}) for {}", images,
                 c.image_token_id, image);
  return out;
}

RopeTable mrope_table(const ModelConfig& c, const std::vector<float>& inv_freq, float attention_scaling,
                      const std::vector<int64_t>& positions) {
  const int64_t half = int64_t(inv_freq.size()), rows = int64_t(positions.size()) / 3;
  std::vector<int64_t> axis_of(static_cast<size_t>(half));
  int64_t j = 0;
  for (int64_t axis = 0; axis < 3; ++axis)
    for (int64_t k = 0; k < c.mrope_section[size_t(axis)]; ++k) axis_of[size_t(j++)] = axis;
  FAB_CHECK(j == half, "mrope_section covers {} of {} rotary pairs", j, half);
  return rope_table_of(rows, half, attention_scaling, MemoryCategory::activations, [&](int64_t r, int64_t p) {
    return float(positions[size_t(axis_of[size_t(p)] * rows + r)]) * inv_freq[size_t(p)];
  });
}

}  // namespace fab
