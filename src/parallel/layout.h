#pragma once
// The parallel layout of a run: how many ranks split each layer (tensor parallel), how many
// pipeline stages (and model chunks per stage) the layers are spread over, how many ranks split
// each row's tokens (context parallel), and how many data-parallel replicas remain:
// world = tp x cp x pp x dp. Read from the config, checked against the
// model's config.json, before any worker starts; every invalid combination is a UserError that
// names the sizes that conflict.
#include <cstdint>
#include <string>
#include <vector>

#include "config/train_config.h"
#include "models/model_config.h"
#include "parallel/mesh.h"

namespace fab {

struct ParallelLayout {
  int tp = 1, pp = 1, vpp = 1, dp = 1, cp = 1;
  std::string cp_comm = "p2p";  // p2p | all_gather | a2a (cp_mode's ring / ulysses read as p2p / a2a)
  bool sequence_parallel = false;
  std::string schedule = "1f1b";  // 1f1b | interleaved_1f1b
  // Decoder layers of each model chunk, in layer order: chunk k runs on stage k % pp as its
  // (k / pp)-th virtual chunk (Megatron's interleaved assignment; with vpp = 1, chunk k is stage
  // k). pp x vpp entries summing to num_hidden_layers.
  std::vector<int64_t> chunk_layers;

  ParallelSizes sizes() const { return {tp, cp, dp, pp}; }
  int chunks() const { return pp * vpp; }
  // The first decoder layer of chunk k.
  int64_t first_layer(int chunk) const;
};

ParallelLayout parallel_layout(const TrainConfig& config, const ModelConfig& model, int world_size);

// Splits the decoder layers into `chunks` consecutive runs that balance the compute of a token:
// the first chunk also holds the embedding, the last the final norm and the LM head, whose
// vocab-sized GEMM costs more than a layer in small models. Minimises the costliest chunk.
std::vector<int64_t> balanced_layer_split(const ModelConfig& model, int chunks, int64_t sequence_length);

}  // namespace fab
