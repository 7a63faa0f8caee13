// Qwen2-VL's image pipeline (qwen2_vl_processor.h).
#include "image/qwen2_vl_processor.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>

#include "core/error.h"
#include "image/resize.h"

namespace fab {
namespace {

using Json = nlohmann::json;

int64_t positive_int(const Json& config, const char* key, int64_t fallback, const std::string& path) {
  if (!config.contains(key) || config[key].is_null()) return fallback;
  FAB_USER_CHECK(config[key].is_number_integer() && config[key].get<int64_t>() > 0,
                 "{}: \"{}\" must be a positive integer, got {}", path, key, config[key].dump());
  return config[key].get<int64_t>();
}

std::array<float, 3> three_floats(const Json& config, const char* key, std::array<float, 3> fallback,
                                  const std::string& path) {
  if (!config.contains(key) || config[key].is_null()) return fallback;
  const Json& v = config[key];
  FAB_USER_CHECK(v.is_array() && v.size() == 3 && v[0].is_number() && v[1].is_number() && v[2].is_number(),
                 "{}: \"{}\" must be a list of 3 numbers, got {}", path, key, v.dump());
  return {v[0].get<float>(), v[1].get<float>(), v[2].get<float>()};
}

// Pillow's Image.resize to sides cut down to integers (LLaMA-Factory's int(side * factor)).
Image scale_by(const Image& image, double factor) {
  const int64_t width = std::max<int64_t>(1, int64_t(double(image.width) * factor));
  const int64_t height = std::max<int64_t>(1, int64_t(double(image.height) * factor));
  return resize_like_pillow(image, width, height);
}

}  // namespace

Qwen2VLImageConfig load_qwen2_vl_image_config(const std::string& path) {
  std::ifstream in(path);
  FAB_USER_CHECK(in.good(), "cannot open {}", path);
  Json config = Json::parse(in, nullptr, false);
  FAB_USER_CHECK(config.is_object(), "{}: not a JSON object", path);
  Qwen2VLImageConfig c;
  c.patch_size = positive_int(config, "patch_size", c.patch_size, path);
  c.temporal_patch_size = positive_int(config, "temporal_patch_size", c.temporal_patch_size, path);
  c.merge_size = positive_int(config, "merge_size", c.merge_size, path);
  if (config.contains("size") && config["size"].is_object()) {
    c.min_pixels = positive_int(config["size"], "shortest_edge", c.min_pixels, path + " size");
    c.max_pixels = positive_int(config["size"], "longest_edge", c.max_pixels, path + " size");
  }
  c.min_pixels = positive_int(config, "min_pixels", c.min_pixels, path);
  c.max_pixels = positive_int(config, "max_pixels", c.max_pixels, path);
  FAB_USER_CHECK(c.min_pixels <= c.max_pixels, "{}: min_pixels {} is above max_pixels {}", path, c.min_pixels,
                 c.max_pixels);
  if (config.contains("rescale_factor") && config["rescale_factor"].is_number())
    c.rescale_factor = config["rescale_factor"].get<double>();
  c.image_mean = three_floats(config, "image_mean", c.image_mean, path);
  c.image_std = three_floats(config, "image_std", c.image_std, path);
  for (const char* key : {"do_resize", "do_rescale", "do_normalize"})
    if (config.contains(key))
      FAB_USER_CHECK(config[key].is_boolean(), "{}: \"{}\" must be true or false", path, key);
  c.do_resize = config.value("do_resize", true);
  c.do_rescale = config.value("do_rescale", true);
  c.do_normalize = config.value("do_normalize", true);
  return c;
}

Image llamafactory_preprocess_image(const Image& image, const ImagePixelBounds& bounds) {
  // BasePlugin._preprocess_image: into [min, max] pixels, in the image's own mode, then RGB.
  Image out = image;
  if (out.pixel_count() > bounds.max_pixels)
    out = scale_by(out, std::sqrt(double(bounds.max_pixels) / double(out.pixel_count())));
  if (out.pixel_count() < bounds.min_pixels)
    out = scale_by(out, std::sqrt(double(bounds.min_pixels) / double(out.pixel_count())));
  out = out.to_rgb();
  out.palette = false;
  // Qwen2VLPlugin._preprocess_image: sides of at least 28, aspect ratios of at most 200 (cut to 180).
  if (std::min(out.width, out.height) < 28)
    out = resize_bicubic(out, std::max<int64_t>(out.width, 28), std::max<int64_t>(out.height, 28));
  if (double(out.width) / double(out.height) > 200) out = resize_bicubic(out, out.height * 180, out.height);
  if (double(out.height) / double(out.width) > 200) out = resize_bicubic(out, out.width, out.width * 180);
  return out;
}

std::pair<int64_t, int64_t> qwen2_vl_smart_resize(int64_t height, int64_t width, int64_t factor, int64_t min_pixels,
                                                  int64_t max_pixels, const std::string& name) {
  FAB_USER_CHECK(double(std::max(height, width)) / double(std::min(height, width)) <= 200,
                 "{}: absolute aspect ratio must be smaller than 200, got {}x{}", name, width, height);
  const double h = double(height), w = double(width), f = double(factor);
  // Python's round(): halves to even, which nearbyint does under the default rounding mode.
  int64_t h_bar = int64_t(std::nearbyint(h / f)) * factor;
  int64_t w_bar = int64_t(std::nearbyint(w / f)) * factor;
  if (h_bar * w_bar > max_pixels) {
    const double beta = std::sqrt(h * w / double(max_pixels));
    h_bar = std::max(factor, int64_t(std::floor(h / beta / f)) * factor);
    w_bar = std::max(factor, int64_t(std::floor(w / beta / f)) * factor);
  } else if (h_bar * w_bar < min_pixels) {
    const double beta = std::sqrt(double(min_pixels) / (h * w));
    h_bar = int64_t(std::ceil(h * beta / f)) * factor;
    w_bar = int64_t(std::ceil(w * beta / f)) * factor;
  }
  return {h_bar, w_bar};
}

std::array<int64_t, 3> qwen2_vl_image_grid(int64_t height, int64_t width, const Qwen2VLImageConfig& config,
                                           const std::string& name) {
  if (config.do_resize)
    std::tie(height, width) = qwen2_vl_smart_resize(height, width, config.patch_size * config.merge_size,
                                                    config.min_pixels, config.max_pixels, name);
  FAB_USER_CHECK(height % (config.patch_size * config.merge_size) == 0 &&
                     width % (config.patch_size * config.merge_size) == 0,
                 "{}: {}x{} is not a multiple of patch_size * merge_size with do_resize false", name, width, height);
  return {1, height / config.patch_size, width / config.patch_size};
}

ValueLevels qwen2_vl_value_levels(const Qwen2VLImageConfig& config) {
  ValueLevels levels;
  for (size_t c = 0; c < 3; ++c)
    for (size_t v = 0; v < 256; ++v) {
      float x = config.do_rescale ? float(double(v) * config.rescale_factor) : float(v);  // float64, then float32
      if (config.do_normalize) x = (x - config.image_mean[c]) / config.image_std[c];
      levels[c][v] = x;
    }
  return levels;
}

Image qwen2_vl_resize(const Image& rgb, const Qwen2VLImageConfig& config, const std::string& name) {
  FAB_CHECK(rgb.channels == 3, "qwen2_vl_resize wants RGB, got {} channels", rgb.channels);
  const std::array<int64_t, 3> grid = qwen2_vl_image_grid(rgb.height, rgb.width, config, name);
  return resize_bicubic(rgb, grid[2] * config.patch_size, grid[1] * config.patch_size);
}

ProcessedImage qwen2_vl_patchify(const Image& resized, const Qwen2VLImageConfig& config) {
  const int64_t p = config.patch_size, m = config.merge_size, t = config.temporal_patch_size;
  FAB_CHECK(resized.channels == 3 && resized.width % (p * m) == 0 && resized.height % (p * m) == 0,
            "qwen2_vl_patchify: {}x{}x{} is no resized image", resized.width, resized.height, resized.channels);
  ProcessedImage out;
  out.grid_thw = {1, resized.height / p, resized.width / p};
  const int64_t grid_h = out.grid_thw[1], grid_w = out.grid_thw[2];
  const ValueLevels lut = qwen2_vl_value_levels(config);
  const int64_t values = config.patch_values();
  out.pixel_values.resize(size_t(out.patches() * values));
  float* dst = out.pixel_values.data();
  // transformers: reshape (gt, t, c, gh/m, m, p, gw/m, m, p), transpose (0, 3, 6, 4, 7, 2, 1, 5, 8).
  // The t copies of a channel's p x p block are the same image: written once, then copied.
  for (int64_t bh = 0; bh < grid_h / m; ++bh)
    for (int64_t bw = 0; bw < grid_w / m; ++bw)
      for (int64_t mh = 0; mh < m; ++mh)
        for (int64_t mw = 0; mw < m; ++mw) {
          const int64_t y0 = (bh * m + mh) * p, x0 = (bw * m + mw) * p;
          for (int64_t c = 0; c < 3; ++c) {
            const float* block = dst;
            for (int64_t py = 0; py < p; ++py) {
              const uint8_t* src = &resized.pixels[size_t(((y0 + py) * resized.width + x0) * 3 + c)];
              for (int64_t px = 0; px < p; ++px) *dst++ = lut[size_t(c)][src[px * 3]];
            }
            for (int64_t tt = 1; tt < t; ++tt, dst += p * p) std::copy_n(block, p * p, dst);
          }
        }
  return out;
}

ProcessedImage qwen2_vl_process_image(const Image& rgb, const Qwen2VLImageConfig& config, const std::string& name) {
  return qwen2_vl_patchify(qwen2_vl_resize(rgb, config, name), config);
}

ProcessedImage qwen2_vl_load_image(const std::string& path, const ImagePixelBounds& bounds,
                                   const Qwen2VLImageConfig& config, const ImageLimits& limits) {
  return qwen2_vl_process_image(llamafactory_preprocess_image(read_image(path, limits), bounds), config, path);
}

}  // namespace fab
