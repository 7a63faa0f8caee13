#include "models/load_weights.h"

#include <cstring>

#include "core/error.h"

namespace fab {

void load_weights(DecoderModel& model, const SafetensorsFile& file) {
  ParamBuffer& params = model.params();
  for (const ParamInfo& p : params.params()) {
    FAB_USER_CHECK(file.contains(p.name), "{}: missing tensor \"{}\" {}", file.path(), p.name, shape_str(p.shape));
    const SafetensorsEntry& e = file.entries().at(p.name);
    FAB_USER_CHECK(e.shape == p.shape, "{}: tensor \"{}\" has shape {} but the config implies {}", file.path(),
                   p.name, shape_str(e.shape), shape_str(p.shape));
    Tensor t = file.as_f32(p.name);
    std::memcpy(params.values().data<float>() + p.offset, t.data<float>(), t.bytes());
  }
  for (const auto& [name, e] : file.entries()) {
    const bool tied_head = name == "lm_head.weight" && model.config().tie_word_embeddings;
    FAB_USER_CHECK(params.contains(name) || tied_head, "{}: unexpected tensor \"{}\" for a {} model", file.path(),
                   name, model.config().model_type);
  }
  model.weights_changed();
}

}  // namespace fab
