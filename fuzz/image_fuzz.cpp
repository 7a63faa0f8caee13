// libFuzzer target for the image decoders' front (`make fuzz`): the input is decoded as a file
// (JPEG, PNG or WebP by its first bytes) under a small pixel cap; anything wrong with it must end
// in a UserError, never a crash, a sanitizer report or a huge allocation.
#include <cstdint>
#include <span>

#include "core/error.h"
#include "image/image.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    fab::decode_image(std::span<const uint8_t>(data, size), "fuzz", fab::ImageLimits{4096 * 4096});
  } catch (const fab::UserError&) {
  }
  return 0;
}
