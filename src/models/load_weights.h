#pragma once
#include "io/safetensors.h"
#include "models/decoder.h"

namespace fab {

// Copies every parameter of `model` from `file` by its Hugging Face name, converting F32/BF16/F16
// to f32. A missing tensor, a shape mismatch or an unexpected extra tensor is a UserError naming
// it (a tied model may also carry lm_head.weight, as some HF exports do; it is ignored).
void load_weights(DecoderModel& model, const SafetensorsFile& file);

}  // namespace fab
