#pragma once
// Supervised packing (LLaMA-Factory's `packing` / `neat_packing` for stage sft,
// processor/supervised.py PackedSupervisedDatasetProcessor): tokenised samples are grouped by
// the greedy knapsack of processor_utils.py into sequences of at most `capacity` tokens. Whether
// attention may cross samples is decided later, when batches are built (train/batch.h).
#include <cstdint>
#include <vector>

#include "config/train_config.h"
#include "dataset/token_sequences.h"

namespace fab {

// LLaMA-Factory's DataArguments lowers cutoff_len by one whenever packing is on (pt included);
// the config with that applied, for tokenising and packing.
TrainConfig with_packing_cutoff(const TrainConfig& config);

// greedy_knapsack: repeatedly fill a bin, each time with the longest sample that still fits, until
// none does. Returns the bins as sample indices in the order they were taken. Among samples of
// equal length the highest index goes first, as LLaMA-Factory's length-to-index lists pop().
// Every length must be <= capacity.
std::vector<std::vector<int64_t>> greedy_knapsack(const std::vector<int64_t>& lengths, int64_t capacity);

struct PackingOptions {
  int64_t capacity = 2048;  // tokens per packed sequence (the lowered cutoff_len)
  // LLaMA-Factory packs inside each preprocessing batch (datasets.map, preprocessing_batch_size
  // = 1000): samples of different groups never share a sequence.
  int64_t group_size = 1000;
};

struct PackingStats {
  int64_t dropped = 0;  // samples longer than the capacity ("Dropped lengthy example")
};

// Packs an unpacked TokenSequences (one sample per sequence). Each sample keeps its labels except
// that the first label of every sample after the first in a sequence becomes -100: the model
// would otherwise learn to predict a sample's first token from the end of the previous one.
// Empty samples are left out (they hold no token to train on). Deterministic. `sources`
// (optional) receives each packed sequence's samples, by index, in their order inside it.
TokenSequences pack_samples(const TokenSequences& samples, const PackingOptions& options,
                            PackingStats* stats = nullptr, std::vector<std::vector<int64_t>>* sources = nullptr);

}  // namespace fab
