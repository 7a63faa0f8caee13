// src/image decoding: formats, EXIF orientation against Pillow, and the user errors of bad files.
#include <gtest/gtest.h>
#include <webp/encode.h>
#include <zlib.h>

#include "dataset/template_test_support.h"
#include "image/image.h"
#include "image/image_test_support.h"

namespace fab {
namespace {

using test::file_bytes;
using test::image_fixture_dir;
using test::user_error_of;

// A PNG's IHDR with other sides, its CRC recomputed.
std::vector<uint8_t> with_png_size(std::vector<uint8_t> png, uint32_t width, uint32_t height) {
  for (int i = 0; i < 4; ++i) {
    png[16 + size_t(i)] = uint8_t(width >> (24 - 8 * i));
    png[20 + size_t(i)] = uint8_t(height >> (24 - 8 * i));
  }
  const uint32_t crc = uint32_t(crc32(0, png.data() + 12, 17));  // "IHDR" and its 13 bytes
  for (int i = 0; i < 4; ++i) png[29 + size_t(i)] = uint8_t(crc >> (24 - 8 * i));
  return png;
}

TEST(ImageDecode, ReadsTheSharedJpegAsRgb) {
  FAB_REQUIRE_SHARED_DATA();
  const Image image = read_image(test::llamafactory_dir() + "/mllm_demo_data/1.jpg");
  EXPECT_EQ(image.width, 300);
  EXPECT_EQ(image.height, 168);
  EXPECT_EQ(image.channels, 3);
  EXPECT_EQ(image.pixels.size(), size_t(300 * 168 * 3));
}

TEST(ImageDecode, PngModes) {
  const Image grey = read_image((image_fixture_dir() / "grey_33x17.png").string());
  EXPECT_EQ(grey.channels, 3);  // L -> RGB, each channel the grey level
  EXPECT_EQ(grey.pixels[0], grey.pixels[1]);
  EXPECT_EQ(grey.pixels[1], grey.pixels[2]);
  const Image rgba = read_image((image_fixture_dir() / "rgba_300x201.png").string());
  EXPECT_EQ(rgba.channels, 4);
  EXPECT_EQ(rgba.pixels[3], 0);  // the transparent top-left corner
  const Image palette = read_image((image_fixture_dir() / "palette_260x190.png").string());
  EXPECT_TRUE(palette.palette);
  EXPECT_EQ(palette.channels, 3);
}

TEST(ImageDecode, ExifOrientationMatchesPillowsExifTranspose) {
  const Image ours = read_image((image_fixture_dir() / "exif6_40x24.jpg").string());
  const Image pillow = read_image((image_fixture_dir() / "exif6_40x24.pillow.png").string());
  EXPECT_EQ(ours.width, 24);  // orientation 6: rotated a quarter turn clockwise
  EXPECT_EQ(ours.height, 40);
  ASSERT_EQ(ours.width, pillow.width);
  ASSERT_EQ(ours.height, pillow.height);
  EXPECT_EQ(ours.pixels, pillow.pixels);
}

TEST(ImageDecode, ExifOrientationTagInBothByteOrders) {
  // TIFF header, one IFD entry: tag 0x0112, type SHORT, count 1, value 8.
  const std::vector<uint8_t> little = {'I', 'I', 42, 0, 8, 0, 0, 0, 1, 0, 0x12, 0x01, 3, 0, 1, 0, 0, 0, 8, 0, 0, 0};
  const std::vector<uint8_t> big = {'M', 'M', 0, 42, 0, 0, 0, 8, 0, 1, 0x01, 0x12, 0, 3, 0, 0, 0, 1, 0, 8, 0, 0};
  EXPECT_EQ(exif_orientation(little), 8);
  EXPECT_EQ(exif_orientation(big), 8);
  EXPECT_EQ(exif_orientation(std::vector<uint8_t>(little.begin(), little.begin() + 12)), 1);  // cut short
  EXPECT_EQ(exif_orientation(std::vector<uint8_t>{'X', 'X', 42, 0}), 1);
}

TEST(ImageDecode, EveryOrientationIsPillowsTranspose) {
  // 3x2, pixel value = its index: each orientation's first row, as Pillow's transposes give it.
  Image image{3, 2, 3, false, {}};
  for (int i = 0; i < 6; ++i)
    for (int c = 0; c < 3; ++c) image.pixels.push_back(uint8_t(i));
  const std::vector<std::vector<uint8_t>> first_row = {
      {0, 1, 2}, {2, 1, 0}, {5, 4, 3}, {3, 4, 5}, {0, 3}, {3, 0}, {5, 2}, {2, 5}};
  for (int orientation = 1; orientation <= 8; ++orientation) {
    const Image out = apply_exif_orientation(image, orientation);
    std::vector<uint8_t> row;
    for (int64_t x = 0; x < out.width; ++x) row.push_back(out.pixels[size_t(x * 3)]);
    EXPECT_EQ(row, first_row[size_t(orientation - 1)]) << "orientation " << orientation;
    EXPECT_EQ(out.width * out.height, 6);
  }
}

TEST(ImageDecode, LosslessWebp) {
  std::vector<uint8_t> rgb(7 * 5 * 3);
  for (size_t i = 0; i < rgb.size(); ++i) rgb[i] = uint8_t(i * 37);
  uint8_t* encoded = nullptr;
  const size_t size = WebPEncodeLosslessRGB(rgb.data(), 7, 5, 7 * 3, &encoded);
  ASSERT_GT(size, 0u);
  const std::vector<uint8_t> bytes(encoded, encoded + size);
  WebPFree(encoded);
  const Image image = decode_image(bytes, "x.webp");
  EXPECT_EQ(image.width, 7);
  EXPECT_EQ(image.height, 5);
  EXPECT_EQ(image.pixels, rgb);
}

TEST(ImageDecode, BadFilesAreUserErrorsNamingTheFile) {
  EXPECT_NE(user_error_of([] { read_image("/nonexistent/a.jpg"); }).find("/nonexistent/a.jpg: cannot open"),
            std::string::npos);
  EXPECT_NE(user_error_of([] { decode_image({}, "e.png"); }).find("e.png: the file is empty"), std::string::npos);
  const std::vector<uint8_t> gif = {'G', 'I', 'F', '8', '9', 'a', 1, 0, 1, 0};
  EXPECT_NE(user_error_of([&] { decode_image(gif, "a.gif"); }).find("not a JPEG, PNG or WebP"), std::string::npos);

  const std::vector<uint8_t> jpeg = file_bytes(image_fixture_dir() / "exif6_40x24.jpg");
  const std::vector<uint8_t> half_jpeg(jpeg.begin(), jpeg.begin() + long(jpeg.size() / 2));
  EXPECT_NE(user_error_of([&] { decode_image(half_jpeg, "half.jpg"); }).find("half.jpg: corrupt or truncated JPEG"),
            std::string::npos);
  const std::vector<uint8_t> png = file_bytes(image_fixture_dir() / "palette_260x190.png");
  const std::vector<uint8_t> half_png(png.begin(), png.begin() + long(png.size() / 2));
  EXPECT_NE(user_error_of([&] { decode_image(half_png, "half.png"); }).find("half.png: corrupt or truncated PNG"),
            std::string::npos);
  std::vector<uint8_t> flipped = png;
  flipped[png.size() / 2] ^= 0x5a;  // inside the IDAT data: its CRC no longer matches
  EXPECT_NE(user_error_of([&] { decode_image(flipped, "bad.png"); }).find("bad.png: corrupt"), std::string::npos);
}

TEST(ImageDecode, ZeroPixelsAndDecompressionBombsAreRefusedFromTheHeader) {
  const std::vector<uint8_t> png = file_bytes(image_fixture_dir() / "grey_33x17.png");
  EXPECT_NE(user_error_of([&] { decode_image(with_png_size(png, 0, 17), "zero.png"); }).find("zero.png"),
            std::string::npos);
  const std::string bomb = user_error_of([&] { decode_image(with_png_size(png, 100000, 100000), "bomb.png"); });
  EXPECT_NE(bomb.find("bomb.png: 100000x100000 = 10000000000 pixels is above the limit"), std::string::npos) << bomb;
  const std::string small_cap = user_error_of([] {
    read_image((image_fixture_dir() / "exif6_40x24.jpg").string(), ImageLimits{100});
  });
  EXPECT_NE(small_cap.find("above the limit of 100"), std::string::npos) << small_cap;
}

}  // namespace
}  // namespace fab
