#pragma once
// From a run config to training data: datasets (LLaMA-Factory registry and formats), template,
// tokenizer and preprocessing, cut into train / eval, cached as memory-mapped token files keyed
// by a hash of everything that shapes them, so a second run (or `fabrica data prepare` ahead of
// time) skips the work.
#include <cstdint>
#include <string>
#include <vector>

#include "config/train_config.h"
#include "dataset/preprocess.h"
#include "dataset/token_sequences.h"
#include "tokenizer/tokenizer.h"

namespace fab {

// pt and sft: one sequence per sample. dpo and rm: two per pair, chosen then rejected. kto: two
// per example, its completion then the mismatched completion of the KL term, and whether it is
// desirable (its kto_tag) in train_desirable / eval_desirable.
struct PreparedData {
  TokenSequences train, eval;
  std::vector<uint8_t> train_desirable, eval_desirable;
  PreprocessStats stats;
  std::string cache_key;
  bool from_cache = false;
};

// `cache_dir` "" means $FABRICA_CACHE, else ~/.cache/fabrica.
PreparedData prepare_data(const TrainConfig& config, const Tokenizer& tokenizer, const std::string& cache_dir = "");

}  // namespace fab
