#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <map>

#include "core/error.h"
#include "io/safetensors.h"
#include "test_util.h"

namespace fab {
namespace {

std::string temp_path(const std::string& name) { return test::scratch_path(name); }

TEST(Safetensors, RoundTripKeepsNamesShapesDtypesAndMetadata) {
  Tensor a = Tensor::empty({2, 3}, DType::f32, MemoryCategory::temporaries);
  for (int i = 0; i < 6; ++i) a.data<float>()[i] = float(i) * 0.5f;
  Tensor b = Tensor::empty({4}, DType::i64, MemoryCategory::temporaries);
  for (int i = 0; i < 4; ++i) b.data<int64_t>()[i] = -100 + i;
  Tensor c = Tensor::empty({3}, DType::bf16, MemoryCategory::temporaries);
  for (int i = 0; i < 3; ++i) c.data<bf16>()[i] = to_bf16(float(i) + 0.25f);
  const std::string path = temp_path("roundtrip.safetensors");
  save_safetensors(path, {{"a", a}, {"b", b}, {"c", c}}, {{"format", "pt"}});
  SafetensorsFile f = SafetensorsFile::open(path);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.tensor("a").shape(), (Shape{2, 3}));
  EXPECT_EQ(f.tensor("a").data<float>()[5], 2.5f);
  EXPECT_EQ(f.tensor("b").data<int64_t>()[0], -100);
  Tensor c32 = f.as_f32("c");
  EXPECT_EQ(c32.data<float>()[2], 2.25f);
  EXPECT_THROW(f.tensor("missing"), UserError);
}

void write_raw(const std::string& path, const std::string& header, size_t data_bytes) {
  std::ofstream out(path, std::ios::binary);
  uint64_t n = header.size();
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << header << std::string(data_bytes, '\0');
}

TEST(Safetensors, MalformedFilesGiveOneClearError) {
  const std::map<std::string, std::string> cases = {
      {"not json", "{oops"},
      {"offsets past the end", R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,64]}})"},
      {"size mismatch", R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}})"},
      {"unknown dtype", R"({"w":{"dtype":"Q4","shape":[4],"data_offsets":[0,16]}})"},
      {"negative dimension", R"({"w":{"dtype":"F32","shape":[-4],"data_offsets":[0,16]}})"},
      {"bad metadata", R"({"__metadata__":{"k":1}})"},
      {"overlapping tensors", R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},
                                  "b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})"},
  };
  for (const auto& [what, header] : cases) {
    const std::string path = temp_path("bad.safetensors");
    write_raw(path, header, 16);
    try {
      SafetensorsFile::open(path);
      ADD_FAILURE() << what << ": accepted";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << what << ": " << e.what();
    }
  }
  try {
    const std::string path = temp_path("overlap.safetensors");
    write_raw(path, cases.at("overlapping tensors"), 16);
    SafetensorsFile::open(path);
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("tensors \"a\" (data_offsets [0, 12]) and \"b\" ([8, 16]) overlap"),
              std::string::npos) << e.what();
  }
  const std::string path = temp_path("short.safetensors");
  { std::ofstream(path) << "abc"; }
  EXPECT_THROW(SafetensorsFile::open(path), UserError);
  std::ofstream(path, std::ios::binary).write("\xff\xff\xff\xff\xff\xff\xff\x7f", 8);
  EXPECT_THROW(SafetensorsFile::open(path), UserError);
  EXPECT_THROW(SafetensorsFile::open(temp_path("does-not-exist.safetensors")), UserError);
}

}  // namespace
}  // namespace fab
