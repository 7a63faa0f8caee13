#pragma once
// Image resizing exactly as Pillow's Image.resize does it (Pillow's libImaging/Resample.c), so
// LLaMA-Factory's pre-resize and Hugging Face's image processors, which both call Pillow, are
// reproduced to the byte:
//   bicubic (a = -0.5, support 2 scaled by the reduction), coefficients normalised per output
//   pixel, then fixed point with 22 fraction bits; two passes, each rounded to 8 bits and skipped
//   when its side keeps its size: horizontal (over only the rows the vertical pass reads) then
//   vertical, or, from Pillow 13 on, vertical first when the height shrinks by more than twice
//   what the width does (Pillow 12 always went horizontal first: such sizes differ by a few
//   levels between the two Pillows).
//   RGBA: resized premultiplied (RGBA -> RGBa -> resize -> RGBA, Pillow's integer conversions).
//   Nearest-neighbour for palette images (Pillow's default resample for mode "P").
#include <cstdint>

#include "image/image.h"

namespace fab {

Image resize_bicubic(const Image& image, int64_t width, int64_t height);
Image resize_nearest(const Image& image, int64_t width, int64_t height);

// Image.resize((width, height)) with its default resample: nearest for palette images, else bicubic.
Image resize_like_pillow(const Image& image, int64_t width, int64_t height);

}  // namespace fab
