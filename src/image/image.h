#pragma once
// Decoded images: JPEG (libjpeg-turbo), PNG (libpng) and WebP (libwebp) to 8-bit RGB, or RGBA
// when the file has a real alpha channel, with the EXIF orientation applied.
//
// Pixels are what Pillow's Image.open gives (libjpeg's default islow DCT and fancy upsampling,
// 16-bit PNG samples cut to their high byte), so the resampling in image/resize.h, done as Pillow
// does it, lands on Pillow's bytes. The alpha channel is kept only because Pillow resizes an RGBA
// image premultiplied; Image::to_rgb() drops it (as Pillow's convert("RGB") does).
//
// Every failure is a UserError naming the file: unreadable, not an image we read, corrupt or
// truncated, 0 pixels, or more pixels than ImageLimits::max_pixels (a decompression bomb: checked
// from the header, before any pixel buffer is allocated).
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace fab {

struct Image {
  int64_t width = 0, height = 0;
  int channels = 3;     // 3: RGB; 4: RGBA with straight alpha
  bool palette = false;  // a palette PNG: Pillow resizes mode "P" nearest-neighbour, not bicubic
  std::vector<uint8_t> pixels;  // row-major, channels interleaved

  int64_t pixel_count() const { return width * height; }
  Image to_rgb() const;  // the alpha channel dropped (Pillow's RGBA -> RGB)
};

// Pillow refuses images above 2 * Image.MAX_IMAGE_PIXELS (DecompressionBombError); so do we.
inline constexpr int64_t kDefaultMaxImagePixels = 2 * 89478485;

struct ImageLimits {
  int64_t max_pixels = kDefaultMaxImagePixels;
};

enum class ImageFormat { unknown, jpeg, png, webp };

// Recognised from the first bytes (magic numbers), never from the file name.
ImageFormat sniff_image_format(std::span<const uint8_t> bytes);

// `name` is used in error messages only (the path, or "<memory>").
Image decode_image(std::span<const uint8_t> bytes, const std::string& name, const ImageLimits& limits = {});

// Reads and decodes a file.
Image read_image(const std::string& path, const ImageLimits& limits = {});

// The EXIF orientation tag (1..8, 1 when absent or unreadable) of a TIFF-structured EXIF block
// (what follows "Exif\0\0" in a JPEG's APP1 marker, or a PNG's eXIf chunk).
int exif_orientation(std::span<const uint8_t> tiff);

// Pillow's ImageOps.exif_transpose for orientation 1..8 (other values leave the image as it is).
Image apply_exif_orientation(const Image& image, int orientation);

}  // namespace fab
