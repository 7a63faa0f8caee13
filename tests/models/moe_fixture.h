#pragma once
// The tiny mixture-of-experts folders of tests/reference/moe (written by make_moe_reference.py)
// and their right-padded batch, shared by the MoE model tests.
#include <string>

#include "io/safetensors.h"
#include "models/decoder.h"

namespace fab::test {

inline std::string moe_dir(const std::string& name) {
  return std::string(FAB_SOURCE_DIR) + "/tests/reference/moe/" + name;
}

// A family's reference.safetensors: the batch and what transformers computed on it.
struct MoeReference {
  SafetensorsFile ref;
  Tensor ids, labels;
  SequenceLayout layout;
  explicit MoeReference(const std::string& name)
      : ref(SafetensorsFile::open(moe_dir(name) + "/reference.safetensors")),
        ids(ref.tensor("input_ids")),
        labels(ref.tensor("labels")) {
    layout.lengths = ref.tensor("lengths");
  }
  float scalar(const std::string& key) const { return ref.tensor(key).data<float>()[0]; }
};

// The logits of the real positions (padding zeroed, as the fixtures store them).
inline Tensor masked_logits(DecoderModel& model, const MoeReference& r) {
  Tensor logits = model.logits(r.ids, r.layout);
  const int64_t B = logits.dim(0), T = logits.dim(1), V = logits.dim(2);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = r.layout.lengths.data<int64_t>()[b]; t < T; ++t)
      for (int64_t v = 0; v < V; ++v) logits.data<float>()[(b * T + t) * V + v] = 0;
  return logits;
}

// A forward/backward on the batch with the model's aux weight: the gradients are those of
// loss_ce (mean over the targets) + weight * aux; returns loss_ce.
inline double ce_and_gradients(DecoderModel& model, const MoeReference& r) {
  model.params().grads().zero_();
  const int64_t n = DecoderModel::count_targets(r.labels);
  return model.forward_backward(r.ids, r.labels, 1.0f / float(n), r.layout) / double(n);
}

}  // namespace fab::test
