#include "dataset/image_cache.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iterator>

#include "core/error.h"
#include "core/file_write.h"

namespace fab {
namespace {

constexpr char kMagic[8] = {'F', 'A', 'B', 'I', 'M', 'G', '0', '1'};

template <typename T>
void put(std::string& out, T value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof value);
}

// The channel of each of a patch's values: (channel, t, 14, 14) order.
size_t channel_of(size_t value_index, const Qwen2VLImageConfig& config) {
  const size_t per_channel = size_t(config.temporal_patch_size * config.patch_size * config.patch_size);
  return (value_index % size_t(config.patch_values())) / per_channel;
}

void put_levels(std::string& out, const ProcessedImage& image, const ValueLevels& levels,
                const Qwen2VLImageConfig& config) {
  for (int64_t v : image.grid_thw) put(out, v);
  put(out, uint64_t(image.pixel_values.size()));
  for (size_t i = 0; i < image.pixel_values.size(); ++i) {
    const auto& channel = levels[channel_of(i, config)];
    const auto at = std::lower_bound(channel.begin(), channel.end(), image.pixel_values[i]);
    FAB_CHECK(at != channel.end() && *at == image.pixel_values[i], "pixel value {} is no level", image.pixel_values[i]);
    out.push_back(char(at - channel.begin()));
  }
}

struct Reader {
  const std::string& bytes;
  const std::string& path;
  size_t at = 0;

  template <typename T>
  T get() {
    FAB_USER_CHECK(bytes.size() - at >= sizeof(T), "image cache {}: cut short", path);
    T value;
    std::memcpy(&value, bytes.data() + at, sizeof value);
    at += sizeof value;
    return value;
  }
};

ProcessedImage get_image(Reader& in, const ValueLevels& levels, const Qwen2VLImageConfig& config) {
  ProcessedImage image;
  for (int64_t& v : image.grid_thw) v = in.get<int64_t>();
  const uint64_t count = in.get<uint64_t>();
  FAB_USER_CHECK(count == uint64_t(image.patches() * config.patch_values()) && in.bytes.size() - in.at >= count,
                 "image cache {}: damaged", in.path);
  image.pixel_values.resize(count);
  for (size_t i = 0; i < count; ++i)
    image.pixel_values[i] = levels[channel_of(i, config)][uint8_t(in.bytes[in.at + i])];
  in.at += count;
  return image;
}

}  // namespace

void save_image_cache(const std::string& path, const ImagesPerSequence& train, const ImagesPerSequence& eval,
                      const Qwen2VLImageConfig& config) {
  const ValueLevels levels = qwen2_vl_value_levels(config);
  std::string out(kMagic, sizeof kMagic);
  for (const ImagesPerSequence* split : {&train, &eval}) {
    put(out, uint64_t(split->size()));
    for (const std::vector<ProcessedImage>& sequence : *split) {
      put(out, uint64_t(sequence.size()));
      for (const ProcessedImage& image : sequence) put_levels(out, image, levels, config);
    }
  }
  write_file_atomically(path, out);
}

void load_image_cache(const std::string& path, ImagesPerSequence& train, ImagesPerSequence& eval,
                      const Qwen2VLImageConfig& config) {
  std::ifstream file(path, std::ios::binary);
  FAB_USER_CHECK(file.good(), "image cache {}: cannot open it", path);
  const std::string bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  FAB_USER_CHECK(bytes.size() >= sizeof kMagic && std::memcmp(bytes.data(), kMagic, sizeof kMagic) == 0,
                 "image cache {}: not a Fabrica image cache", path);
  const ValueLevels levels = qwen2_vl_value_levels(config);
  Reader in{bytes, path, sizeof kMagic};
  for (ImagesPerSequence* split : {&train, &eval}) {
    const uint64_t sequences = in.get<uint64_t>();
    FAB_USER_CHECK(sequences <= bytes.size(), "image cache {}: damaged", path);
    split->assign(sequences, {});
    for (std::vector<ProcessedImage>& sequence : *split) {
      const uint64_t images = in.get<uint64_t>();
      FAB_USER_CHECK(images <= bytes.size(), "image cache {}: damaged", path);
      for (uint64_t i = 0; i < images; ++i) sequence.push_back(get_image(in, levels, config));
    }
  }
  FAB_USER_CHECK(in.at == bytes.size(), "image cache {}: trailing bytes", path);
}

}  // namespace fab
