// JPEG, PNG and WebP decoding (image.h). libjpeg and libpng report errors by longjmp: each decode
// runs in a function whose frames between setjmp and the library calls hold only plain data, and
// the error text is turned into a UserError after the jump.
#include <csetjmp>
#include <cstddef>
#include <cstdio>  // before jpeglib.h, which uses size_t and FILE
#include <cstring>
#include <fstream>
#include <iterator>

#include <jerror.h>
#include <jpeglib.h>
#include <png.h>
#include <webp/decode.h>

#include "core/error.h"
#include "image/image.h"

namespace fab {
namespace {

void check_size(int64_t width, int64_t height, const std::string& name, const ImageLimits& limits) {
  FAB_USER_CHECK(width > 0 && height > 0, "image {}: it has 0 pixels ({}x{})", name, width, height);
  FAB_USER_CHECK(width <= limits.max_pixels / height,
                 "image {}: {}x{} = {} pixels is above the limit of {} (a decompression bomb?)", name, width, height,
                 width * height, limits.max_pixels);
}

// ---- JPEG ---------------------------------------------------------------------------------------

struct JpegError {
  jpeg_error_mgr mgr;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
  bool truncated;  // libjpeg's "premature end of data" warning: it pads with grey, Pillow refuses
};

void jpeg_error_exit(j_common_ptr cinfo) {
  auto* error = reinterpret_cast<JpegError*>(cinfo->err);
  cinfo->err->format_message(cinfo, error->message);
  std::longjmp(error->jump, 1);
}

void jpeg_no_output(j_common_ptr) {}

void jpeg_note_warning(j_common_ptr cinfo, int level) {
  if (level < 0 && cinfo->err->msg_code == JWRN_JPEG_EOF) reinterpret_cast<JpegError*>(cinfo->err)->truncated = true;
}

struct JpegHeader {
  int64_t width = 0, height = 0;
  J_COLOR_SPACE color = JCS_UNKNOWN;
};

// Returns "" or libjpeg's message. `pixels` is filled once the header passed `accept_header`.
template <typename AcceptHeader>
std::string decode_jpeg_raw(std::span<const uint8_t> bytes, std::vector<uint8_t>& pixels,
                            std::vector<uint8_t>& exif, AcceptHeader&& accept_header) {
  jpeg_decompress_struct cinfo;
  JpegError error;
  cinfo.err = jpeg_std_error(&error.mgr);
  error.mgr.error_exit = jpeg_error_exit;
  error.mgr.output_message = jpeg_no_output;
  error.mgr.emit_message = jpeg_note_warning;
  error.message[0] = '\0';
  error.truncated = false;
  if (setjmp(error.jump)) {
    jpeg_destroy_decompress(&cinfo);
    return error.message[0] ? error.message : "invalid JPEG data";
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, bytes.data(), static_cast<unsigned long>(bytes.size()));
  jpeg_save_markers(&cinfo, JPEG_APP0 + 1, 0xFFFF);
  jpeg_read_header(&cinfo, TRUE);
  if (!accept_header(JpegHeader{cinfo.image_width, cinfo.image_height, cinfo.jpeg_color_space})) {
    jpeg_destroy_decompress(&cinfo);
    return "";
  }
  for (jpeg_saved_marker_ptr m = cinfo.marker_list; m; m = m->next)
    if (m->marker == JPEG_APP0 + 1 && m->data_length > 6 && std::memcmp(m->data, "Exif\0\0", 6) == 0) {
      exif.assign(m->data + 6, m->data + m->data_length);
      break;
    }
  cinfo.out_color_space = JCS_RGB;
  jpeg_start_decompress(&cinfo);
  const size_t row_bytes = size_t(cinfo.output_width) * 3;
  pixels.resize(row_bytes * cinfo.output_height);
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW row = pixels.data() + row_bytes * cinfo.output_scanline;
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  return error.truncated ? "premature end of data" : "";
}

Image decode_jpeg(std::span<const uint8_t> bytes, const std::string& name, const ImageLimits& limits,
                  std::vector<uint8_t>& exif) {
  Image image;
  std::string refusal;
  const std::string failure = decode_jpeg_raw(bytes, image.pixels, exif, [&](const JpegHeader& header) {
    image.width = header.width;
    image.height = header.height;
    try {
      check_size(header.width, header.height, name, limits);
    } catch (const UserError& e) {
      refusal = e.what();
      return false;
    }
    if (header.color == JCS_CMYK || header.color == JCS_YCCK) {
      refusal = format("image {}: CMYK JPEG images are not supported; convert it to RGB", name);
      return false;
    }
    return true;
  });
  if (!refusal.empty()) throw UserError(refusal);
  FAB_USER_CHECK(failure.empty(), "image {}: corrupt or truncated JPEG ({})", name, failure);
  return image;
}

// ---- PNG ----------------------------------------------------------------------------------------

struct PngSource {
  std::span<const uint8_t> bytes;
  size_t offset = 0;
};

struct PngError {
  char message[256];
};

void png_read_from_memory(png_structp png, png_bytep out, png_size_t length) {
  auto* source = static_cast<PngSource*>(png_get_io_ptr(png));
  if (source->bytes.size() - source->offset < length) png_error(png, "truncated PNG data");
  std::memcpy(out, source->bytes.data() + source->offset, length);
  source->offset += length;
}

void png_error_handler(png_structp png, png_const_charp message) {
  auto* error = static_cast<PngError*>(png_get_error_ptr(png));
  std::snprintf(error->message, sizeof(error->message), "%s", message);
  png_longjmp(png, 1);
}

void png_warning_handler(png_structp, png_const_charp) {}

struct PngHeader {
  int64_t width = 0, height = 0;
  int color_type = 0;
};

template <typename AcceptHeader>
std::string decode_png_raw(std::span<const uint8_t> bytes, std::vector<uint8_t>& pixels, int& channels,
                           std::vector<uint8_t>& exif, uint32_t max_side, AcceptHeader&& accept_header) {
  PngError error{};
  PngSource source{bytes, 0};
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &error, png_error_handler, png_warning_handler);
  if (!png) return "out of memory";
  png_infop info = png_create_info_struct(png);
  if (!info) {
    png_destroy_read_struct(&png, nullptr, nullptr);
    return "out of memory";
  }
  std::vector<png_bytep>* volatile rows = nullptr;  // owned here: freed on both paths
  if (setjmp(png_jmpbuf(png))) {
    delete rows;
    png_destroy_read_struct(&png, &info, nullptr);
    return error.message[0] ? error.message : "invalid PNG data";
  }
  png_set_user_limits(png, max_side, max_side);
  png_set_read_fn(png, &source, png_read_from_memory);
  png_read_info(png, info);
  const int color_type = png_get_color_type(png, info);
  if (!accept_header(PngHeader{png_get_image_width(png, info), png_get_image_height(png, info), color_type})) {
    png_destroy_read_struct(&png, &info, nullptr);
    return "";
  }
  png_uint_32 exif_length = 0;
  png_bytep exif_data = nullptr;
  if (png_get_eXIf_1(png, info, &exif_length, &exif_data) && exif_data) exif.assign(exif_data, exif_data + exif_length);
  png_set_strip_16(png);  // Pillow keeps the high byte of 16-bit RGB(A) samples
  png_set_packing(png);
  png_set_palette_to_rgb(png);
  png_set_expand_gray_1_2_4_to_8(png);
  png_set_gray_to_rgb(png);
  // tRNS (a transparent colour or palette entry) is no alpha channel to Pillow: mode stays P/L/RGB.
  if (!(color_type & PNG_COLOR_MASK_ALPHA)) png_set_strip_alpha(png);
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  channels = png_get_channels(png, info);
  const size_t row_bytes = png_get_rowbytes(png, info);
  const size_t height = png_get_image_height(png, info);
  pixels.resize(row_bytes * height);
  rows = new std::vector<png_bytep>(height);
  for (size_t y = 0; y < height; ++y) (*rows)[y] = pixels.data() + y * row_bytes;
  png_read_image(png, rows->data());
  png_read_end(png, nullptr);
  delete rows;
  png_destroy_read_struct(&png, &info, nullptr);
  return "";
}

Image decode_png(std::span<const uint8_t> bytes, const std::string& name, const ImageLimits& limits,
                 std::vector<uint8_t>& exif) {
  Image image;
  std::string refusal;
  const uint32_t max_side = uint32_t(std::min<int64_t>(limits.max_pixels, 0x7fffffff));
  const std::string failure =
      decode_png_raw(bytes, image.pixels, image.channels, exif, max_side, [&](const PngHeader& header) {
        image.width = header.width;
        image.height = header.height;
        image.palette = header.color_type == PNG_COLOR_TYPE_PALETTE;
        try {
          check_size(header.width, header.height, name, limits);
        } catch (const UserError& e) {
          refusal = e.what();
          return false;
        }
        return true;
      });
  if (!refusal.empty()) throw UserError(refusal);
  FAB_USER_CHECK(failure.empty(), "image {}: corrupt or truncated PNG ({})", name, failure);
  FAB_CHECK(image.channels == 3 || image.channels == 4, "PNG decoded to {} channels", image.channels);
  return image;
}

// ---- WebP ---------------------------------------------------------------------------------------

Image decode_webp(std::span<const uint8_t> bytes, const std::string& name, const ImageLimits& limits) {
  WebPBitstreamFeatures features;
  FAB_USER_CHECK(WebPGetFeatures(bytes.data(), bytes.size(), &features) == VP8_STATUS_OK,
                 "image {}: corrupt or truncated WebP header", name);
  FAB_USER_CHECK(!features.has_animation, "image {}: animated WebP images are not supported", name);
  Image image;
  image.width = features.width;
  image.height = features.height;
  check_size(image.width, image.height, name, limits);
  image.channels = features.has_alpha ? 4 : 3;
  image.pixels.resize(size_t(image.width * image.height * image.channels));
  const int stride = int(image.width * image.channels);
  const uint8_t* ok = features.has_alpha
                          ? WebPDecodeRGBAInto(bytes.data(), bytes.size(), image.pixels.data(), image.pixels.size(), stride)
                          : WebPDecodeRGBInto(bytes.data(), bytes.size(), image.pixels.data(), image.pixels.size(), stride);
  FAB_USER_CHECK(ok != nullptr, "image {}: corrupt or truncated WebP data", name);
  return image;
}

}  // namespace

ImageFormat sniff_image_format(std::span<const uint8_t> bytes) {
  static constexpr uint8_t kPng[] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (bytes.size() >= 3 && bytes[0] == 0xFF && bytes[1] == 0xD8 && bytes[2] == 0xFF) return ImageFormat::jpeg;
  if (bytes.size() >= 8 && std::memcmp(bytes.data(), kPng, 8) == 0) return ImageFormat::png;
  if (bytes.size() >= 12 && std::memcmp(bytes.data(), "RIFF", 4) == 0 && std::memcmp(bytes.data() + 8, "WEBP", 4) == 0)
    return ImageFormat::webp;
  return ImageFormat::unknown;
}

Image decode_image(std::span<const uint8_t> bytes, const std::string& name, const ImageLimits& limits) {
  FAB_USER_CHECK(!bytes.empty(), "image {}: the file is empty", name);
  std::vector<uint8_t> exif;
  Image image;
  switch (sniff_image_format(bytes)) {
    case ImageFormat::jpeg: image = decode_jpeg(bytes, name, limits, exif); break;
    case ImageFormat::png: image = decode_png(bytes, name, limits, exif); break;
    case ImageFormat::webp: image = decode_webp(bytes, name, limits); break;
    case ImageFormat::unknown:
      throw UserError(format("image {}: not a JPEG, PNG or WebP file (unrecognised first bytes)", name));
  }
  const int orientation = exif.empty() ? 1 : exif_orientation(exif);
  return orientation == 1 ? image : apply_exif_orientation(image, orientation);
}

Image read_image(const std::string& path, const ImageLimits& limits) {
  std::ifstream in(path, std::ios::binary);
  FAB_USER_CHECK(in.good(), "image {}: cannot open it ({})", path, std::strerror(errno));
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  FAB_USER_CHECK(!in.bad(), "image {}: read error ({})", path, std::strerror(errno));
  return decode_image(bytes, path, limits);
}

Image Image::to_rgb() const {
  if (channels == 3) return *this;
  Image rgb{width, height, 3, palette, {}};
  rgb.pixels.resize(size_t(width * height * 3));
  for (int64_t i = 0; i < width * height; ++i)
    for (int c = 0; c < 3; ++c) rgb.pixels[size_t(i * 3 + c)] = pixels[size_t(i * channels + c)];
  return rgb;
}

}  // namespace fab
