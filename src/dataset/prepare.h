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
#include "image/qwen2_vl_processor.h"
#include "tokenizer/tokenizer.h"

namespace fab {

// pt and sft: one sequence per sample. dpo and rm: two per pair, chosen then rejected. kto: two
// per example, its completion then the mismatched completion of the KL term, and whether it is
// desirable (its kto_tag) in train_desirable / eval_desirable.
// Image datasets (stages sft, dpo and rm, no packing): train_images / eval_images hold each sequence's images
// ({pixel_values, grid_thw} in <|image_pad|> order, the model's preprocessor_config.json applied),
// one entry per sequence; both are empty for text data.
struct PreparedData {
  TokenSequences train, eval;
  std::vector<uint8_t> train_desirable, eval_desirable;
  std::vector<std::vector<ProcessedImage>> train_images, eval_images;
  PreprocessStats stats;
  std::string cache_key;
  bool from_cache = false;
};

// `cache_dir` "" means $FABRICA_CACHE, else ~/.cache/fabrica. Image data caches its pixels too
// (dataset/image_cache.h), rebuilt when an image file changes.
bool has_images(const PreparedData& data);

PreparedData prepare_data(const TrainConfig& config, const Tokenizer& tokenizer, const std::string& cache_dir = "");

}  // namespace fab
