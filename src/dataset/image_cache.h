#pragma once
// The images of prepared data, cached beside its token files (<key>.images.bin): per split, per
// sequence, per image its grid and its pixel values as uint8 levels (every value is one of the 256
// of its channel, qwen2_vl_value_levels: a quarter of the floats' size), turned back into the same
// floats on load. prepare.cpp keeps each image file's identity in the cache's JSON, so a changed
// image rebuilds the cache.
#include <string>
#include <vector>

#include "image/qwen2_vl_processor.h"

namespace fab {

using ImagesPerSequence = std::vector<std::vector<ProcessedImage>>;  // per sequence

// Written atomically.
void save_image_cache(const std::string& path, const ImagesPerSequence& train, const ImagesPerSequence& eval,
                      const Qwen2VLImageConfig& config);

// UserError when the file is missing, cut short or not this format (the caller rebuilds).
void load_image_cache(const std::string& path, ImagesPerSequence& train, ImagesPerSequence& eval,
                      const Qwen2VLImageConfig& config);

}  // namespace fab
