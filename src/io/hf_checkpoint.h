#pragma once
// Hugging Face weight folders: a single model.safetensors, or shards listed by
// model.safetensors.index.json ({"metadata": {"total_size": N}, "weight_map": {name: file}}).
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "io/safetensors.h"

namespace fab {

// All tensors of a folder's weights, whichever layout it uses; files stay memory-mapped.
class HfWeights {
 public:
  static HfWeights open(const std::string& folder);
  // True when the folder holds model.safetensors or model.safetensors.index.json; false when it
  // holds no weight files at all. Weights it cannot read are a UserError naming them: pickles
  // (.bin, .pt: never unpickled; the message gives the command that converts them), safetensors
  // shards without their index, other formats.
  static bool present(const std::string& folder);

  std::vector<std::string> names() const;
  bool contains(const std::string& name) const { return where_.count(name) != 0; }
  const SafetensorsFile& file_of(const std::string& name) const;

 private:
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, size_t> where_;  // tensor name -> index into files_
};

// Writes tensors as model.safetensors, or as model-0000i-of-0000n.safetensors shards of at most
// `max_shard_bytes` plus model.safetensors.index.json when they do not fit in one. Each file is
// written atomically.
void save_hf_weights(const std::string& folder, const std::vector<NamedTensor>& tensors, size_t max_shard_bytes);

}  // namespace fab
