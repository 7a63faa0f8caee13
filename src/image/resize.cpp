// Pillow's resampling (resize.h), transcribed from Pillow 13.0's libImaging/Resample.c: precompute_coeffs,
// normalize_coeffs_8bpc, ImagingResampleHorizontal_8bpc / Vertical_8bpc, ImagingResampleInner;
// and from libImaging/Convert.c: rgbA2rgba / rgba2rgbA (premultiplied alpha).
#include "image/resize.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace fab {
namespace {

constexpr int kPrecisionBits = 32 - 8 - 2;

double bicubic_filter(double x) {
  constexpr double a = -0.5;
  if (x < 0.0) x = -x;
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
  return 0.0;
}

// Per output pixel: the first input pixel, how many it reads, and their fixed-point weights.
struct Coefficients {
  int ksize = 0;
  std::vector<int> first, count;
  std::vector<int32_t> weights;  // out_size x ksize
};

Coefficients precompute_coefficients(int64_t in_size, int64_t out_size) {
  constexpr double kSupport = 2.0;
  const double scale = double(float(in_size)) / double(out_size);
  const double filterscale = std::max(scale, 1.0);
  const double support = kSupport * filterscale;
  Coefficients c;
  c.ksize = int(std::ceil(support)) * 2 + 1;
  c.first.resize(size_t(out_size));
  c.count.resize(size_t(out_size));
  c.weights.assign(size_t(out_size) * size_t(c.ksize), 0);
  std::vector<double> k(size_t(c.ksize));
  for (int64_t xx = 0; xx < out_size; ++xx) {
    const double center = (double(xx) + 0.5) * scale;
    const double ss = 1.0 / filterscale;
    const int xmin = std::max(0, int(center - support + 0.5));
    const int xmax = int(std::min<double>(double(int(center + support + 0.5)), double(in_size))) - xmin;
    double ww = 0.0;
    for (int x = 0; x < xmax; ++x) {
      k[size_t(x)] = bicubic_filter((x + xmin - center + 0.5) * ss);
      ww += k[size_t(x)];
    }
    int32_t* out = &c.weights[size_t(xx) * size_t(c.ksize)];
    for (int x = 0; x < xmax; ++x) {
      const double w = ww != 0.0 ? k[size_t(x)] / ww : k[size_t(x)];
      out[x] = w < 0 ? int32_t(-0.5 + w * (1 << kPrecisionBits)) : int32_t(0.5 + w * (1 << kPrecisionBits));
    }
    c.first[size_t(xx)] = xmin;
    c.count[size_t(xx)] = xmax;
  }
  return c;
}

uint8_t clip8(int32_t sum) { return uint8_t(std::clamp(sum >> kPrecisionBits, 0, 255)); }

// Both passes are integer sums, so their order is free: the result is Pillow's bit for bit
// whatever the loop order or thread count. Output rows are independent and split over the OpenMP
// threads (one thread inside a parallel region, as when the dataset decodes images in parallel).
// An image this small is resampled on one thread.
constexpr int64_t kParallelBytes = 1 << 16;

// One output pixel of `ch` channels: the sum of `count` input pixels from `src` with weights `k`.
template <int ch>
void resample_pixel(const uint8_t* src, const int32_t* k, int count, uint8_t* dst) {
  int32_t sum[ch];
  for (int c = 0; c < ch; ++c) sum[c] = 1 << (kPrecisionBits - 1);
  for (int i = 0; i < count; ++i)
    for (int c = 0; c < ch; ++c) sum[c] += int32_t(src[i * ch + c]) * k[i];
  for (int c = 0; c < ch; ++c) dst[c] = clip8(sum[c]);
}

template <int ch>
void resample_row(const uint8_t* row, uint8_t* dst, int64_t width, const Coefficients& c) {
  for (int64_t x = 0; x < width; ++x)
    resample_pixel<ch>(row + size_t(c.first[size_t(x)]) * ch, &c.weights[size_t(x) * size_t(c.ksize)],
                       c.count[size_t(x)], dst + x * ch);
}

// Rows [row_offset, row_offset + out.height) of `in`, resampled along x into `out`.
void resample_horizontal(const Image& in, Image& out, int64_t row_offset, const Coefficients& c) {
  const int ch = in.channels;
#pragma omp parallel for schedule(static) if (int64_t(out.pixels.size()) > kParallelBytes)
  for (int64_t y = 0; y < out.height; ++y) {
    const uint8_t* row = &in.pixels[size_t((y + row_offset) * in.width * ch)];
    uint8_t* dst = &out.pixels[size_t(y * out.width * ch)];
    switch (ch) {
      case 1: resample_row<1>(row, dst, out.width, c); break;
      case 2: resample_row<2>(row, dst, out.width, c); break;
      case 3: resample_row<3>(row, dst, out.width, c); break;
      default: resample_row<4>(row, dst, out.width, c); break;
    }
  }
}

// Each output row: the input rows it reads, weighted and summed a whole row at a time (the inner
// loop runs along the row, which the compiler vectorises).
void resample_vertical(const Image& in, Image& out, const std::vector<int>& first, const Coefficients& c) {
  const int64_t row_bytes = in.width * in.channels;
#pragma omp parallel if (int64_t(out.pixels.size()) > kParallelBytes)
  {
    std::vector<int32_t> sum(static_cast<size_t>(row_bytes));
#pragma omp for schedule(static)
    for (int64_t y = 0; y < out.height; ++y) {
      const int32_t* k = &c.weights[size_t(y) * size_t(c.ksize)];
      std::fill(sum.begin(), sum.end(), 1 << (kPrecisionBits - 1));
      for (int j = 0; j < c.count[size_t(y)]; ++j) {
        const uint8_t* src = &in.pixels[size_t((first[size_t(y)] + j) * row_bytes)];
        const int32_t w = k[j];
        int32_t* acc = sum.data();
        for (int64_t i = 0; i < row_bytes; ++i) acc[i] += int32_t(src[i]) * w;
      }
      uint8_t* dst = &out.pixels[size_t(y * row_bytes)];
      for (int64_t i = 0; i < row_bytes; ++i) dst[i] = clip8(sum[size_t(i)]);
    }
  }
}

Image blank_like(const Image& image, int64_t width, int64_t height) {
  Image out{width, height, image.channels, image.palette, {}};
  out.pixels.resize(size_t(width * height * image.channels));
  return out;
}

// ImagingResampleInner (Pillow 13): horizontal first (over only the rows the vertical pass reads),
// unless the height shrinks by more than twice what the width does: then vertical first.
Image resample_bicubic(const Image& image, int64_t width, int64_t height) {
  const bool horizontal = width != image.width, vertical = height != image.height;
  const bool horizontal_first = !(image.height - height > 0 && image.height - height > (image.width - width) * 2);
  const Coefficients cx = precompute_coefficients(image.width, width);
  const Coefficients cy = precompute_coefficients(image.height, height);
  if (!horizontal_first) {
    Image temp = blank_like(image, image.width, height);
    resample_vertical(image, temp, cy.first, cy);
    if (!horizontal) return temp;
    Image out = blank_like(image, width, height);
    resample_horizontal(temp, out, 0, cx);
    return out;
  }
  std::vector<int> first_row = cy.first;
  Image current = image;
  if (horizontal) {
    const int64_t first = cy.first.front(), last = cy.first.back() + cy.count.back();
    for (int& row : first_row) row -= int(first);
    Image temp = blank_like(image, width, last - first);
    resample_horizontal(image, temp, first, cx);
    current = std::move(temp);
  }
  if (!vertical) return current;
  Image out = blank_like(current, current.width, height);
  resample_vertical(current, out, first_row, cy);
  return out;
}

uint8_t muldiv255(uint32_t a, uint32_t b) {
  const uint32_t tmp = a * b + 128;
  return uint8_t(((tmp >> 8) + tmp) >> 8);
}

void premultiply(Image& image) {
  for (size_t i = 0; i < image.pixels.size(); i += 4)
    for (int c = 0; c < 3; ++c) image.pixels[i + size_t(c)] = muldiv255(image.pixels[i + size_t(c)], image.pixels[i + 3]);
}

void unpremultiply(Image& image) {
  for (size_t i = 0; i < image.pixels.size(); i += 4) {
    const uint32_t alpha = image.pixels[i + 3];
    if (alpha == 255 || alpha == 0) continue;
    for (int c = 0; c < 3; ++c)
      image.pixels[i + size_t(c)] = uint8_t(std::min<uint32_t>(255, (255 * uint32_t(image.pixels[i + size_t(c)])) / alpha));
  }
}

}  // namespace

Image resize_bicubic(const Image& image, int64_t width, int64_t height) {
  FAB_CHECK(width > 0 && height > 0 && image.width > 0 && image.height > 0, "resize {}x{} -> {}x{}", image.width,
            image.height, width, height);
  if (width == image.width && height == image.height) return image;
  if (image.channels != 4) return resample_bicubic(image, width, height);
  Image premultiplied = image;
  premultiply(premultiplied);
  Image out = resample_bicubic(premultiplied, width, height);
  unpremultiply(out);
  return out;
}

// Pillow's affine transform with nearest neighbour (the source pixel under each output centre).
Image resize_nearest(const Image& image, int64_t width, int64_t height) {
  FAB_CHECK(width > 0 && height > 0, "resize to {}x{}", width, height);
  Image out = blank_like(image, width, height);
  const double sx = double(image.width) / double(width), sy = double(image.height) / double(height);
  const int ch = image.channels;
  for (int64_t y = 0; y < height; ++y) {
    const int64_t src_y = std::min<int64_t>(image.height - 1, int64_t((double(y) + 0.5) * sy));
    for (int64_t x = 0; x < width; ++x) {
      const int64_t src_x = std::min<int64_t>(image.width - 1, int64_t((double(x) + 0.5) * sx));
      for (int c = 0; c < ch; ++c)
        out.pixels[size_t((y * width + x) * ch + c)] = image.pixels[size_t((src_y * image.width + src_x) * ch + c)];
    }
  }
  return out;
}

Image resize_like_pillow(const Image& image, int64_t width, int64_t height) {
  return image.palette ? resize_nearest(image, width, height) : resize_bicubic(image, width, height);
}

}  // namespace fab
