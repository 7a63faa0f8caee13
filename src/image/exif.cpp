// The EXIF orientation tag and Pillow's ImageOps.exif_transpose (image.h).
#include "image/image.h"

namespace fab {
namespace {

// A TIFF block's integers, in its byte order; 0 past the end (the tag then reads as absent).
struct TiffReader {
  std::span<const uint8_t> bytes;
  bool little_endian = true;

  uint32_t read(size_t offset, int width) const {
    if (offset > bytes.size() || bytes.size() - offset < size_t(width)) return 0;
    uint32_t value = 0;
    for (int i = 0; i < width; ++i) {
      const uint32_t byte = bytes[offset + size_t(little_endian ? i : width - 1 - i)];
      value |= byte << (8 * i);
    }
    return value;
  }
};

}  // namespace

int exif_orientation(std::span<const uint8_t> tiff) {
  if (tiff.size() < 8) return 1;
  TiffReader reader{tiff, tiff[0] == 'I'};
  if (!((tiff[0] == 'I' && tiff[1] == 'I') || (tiff[0] == 'M' && tiff[1] == 'M')) || reader.read(2, 2) != 42) return 1;
  const size_t ifd = reader.read(4, 4);
  const uint32_t entries = reader.read(ifd, 2);
  for (uint32_t i = 0; i < entries; ++i) {
    const size_t entry = ifd + 2 + size_t(i) * 12;
    if (entry + 12 > tiff.size()) break;
    if (reader.read(entry, 2) != 0x0112) continue;  // Orientation, a SHORT
    const uint32_t value = reader.read(entry + 8, 2);
    return value >= 1 && value <= 8 ? int(value) : 1;
  }
  return 1;
}

Image apply_exif_orientation(const Image& image, int orientation) {
  if (orientation < 2 || orientation > 8) return image;
  const int64_t w = image.width, h = image.height;
  const bool swaps = orientation >= 5;  // transpose, rotate 270, transverse, rotate 90
  Image out{swaps ? h : w, swaps ? w : h, image.channels, image.palette, {}};
  out.pixels.resize(image.pixels.size());
  for (int64_t y = 0; y < out.height; ++y)
    for (int64_t x = 0; x < out.width; ++x) {
      int64_t sx = x, sy = y;
      switch (orientation) {
        case 2: sx = w - 1 - x; break;                   // FLIP_LEFT_RIGHT
        case 3: sx = w - 1 - x, sy = h - 1 - y; break;   // ROTATE_180
        case 4: sy = h - 1 - y; break;                   // FLIP_TOP_BOTTOM
        case 5: sx = y, sy = x; break;                   // TRANSPOSE
        case 6: sx = y, sy = h - 1 - x; break;           // ROTATE_270 (clockwise)
        case 7: sx = w - 1 - y, sy = h - 1 - x; break;   // TRANSVERSE
        case 8: sx = w - 1 - y, sy = x; break;           // ROTATE_90 (counter-clockwise)
      }
      const uint8_t* from = &image.pixels[size_t((sy * w + sx) * image.channels)];
      uint8_t* to = &out.pixels[size_t((y * out.width + x) * image.channels)];
      for (int c = 0; c < image.channels; ++c) to[c] = from[c];
    }
  return out;
}

}  // namespace fab
