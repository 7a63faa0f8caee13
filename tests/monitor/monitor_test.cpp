#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <sstream>

#include "monitor/loss_plot.h"
#include "monitor/tensorboard.h"
#include "test_util.h"

namespace fab {
namespace {

TEST(TensorBoard, Crc32cMatchesTheStandardCheckValue) {
  EXPECT_EQ(crc32c("123456789", 9), 0xe3069283u);  // the CRC-32C (Castagnoli) check value
}

TEST(TensorBoard, WritesFramedRecords) {
  std::string path;
  {
    TensorBoardWriter w(test::fresh_dir("tb"));
    w.add_scalar("train/loss", 2.5, 1);
    path = w.path();
  }
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  size_t pos = 0, records = 0;
  while (pos + 12 <= bytes.size()) {  // length, crc, data, crc
    uint64_t len;
    std::memcpy(&len, bytes.data() + pos, 8);
    pos += 12 + len + 4;
    ++records;
  }
  EXPECT_EQ(pos, bytes.size());
  EXPECT_EQ(records, 2u);
  EXPECT_NE(bytes.find("brain.Event:2"), std::string::npos);
  EXPECT_NE(bytes.find("train/loss"), std::string::npos);
}

TEST(LossPlot, WritesAnSvgWithBothCurves) {
  const std::string path = test::scratch_path("loss.svg");
  write_loss_plot(path, {1, 2, 3, 4}, {4.0, 3.0, 2.5, 2.0}, "test run");
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  EXPECT_NE(s.str().find("<svg"), std::string::npos);
  EXPECT_NE(s.str().find("test run"), std::string::npos);
  size_t lines = 0;
  for (size_t p = s.str().find("<polyline"); p != std::string::npos; p = s.str().find("<polyline", p + 1)) ++lines;
  EXPECT_EQ(lines, 2u);
}

}  // namespace
}  // namespace fab
