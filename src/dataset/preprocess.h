#pragma once
// Examples -> token ids and labels, as LLaMA-Factory's dataset processors build them:
//   supervised (processor/supervised.py SupervisedDatasetProcessor, without packing),
//   pretraining (processor/pretrain.py PretrainDatasetProcessor),
//   pairwise   (processor/pairwise.py PairwiseDatasetProcessor, for DPO/reward data),
// with processor_utils.py infer_seqlen for truncation. Labels use -100 where no loss is taken.
// Examples are encoded on all of OpenMP's threads; the result, and the error raised by the first
// bad example, are those of a loop in example order.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "dataset/dataset.h"
#include "dataset/template.h"

namespace fab {

inline constexpr int32_t kIgnoreIndex = -100;  // LLaMA-Factory's IGNORE_INDEX

// How many source and target tokens survive a cutoff (processor_utils.infer_seqlen): a short
// target is kept whole, else a short source is, else both shrink in proportion.
std::pair<int64_t, int64_t> infer_seqlen(int64_t source_len, int64_t target_len, int64_t cutoff_len);

struct TokenizedSample {
  std::vector<int32_t> input_ids;
  std::vector<int32_t> labels;
};

struct PreprocessStats {
  int64_t samples = 0;    // samples produced
  int64_t tokens = 0;     // tokens in them
  int64_t truncated = 0;  // examples cut by cutoff_len
  int64_t skipped = 0;    // examples dropped as invalid (LLaMA-Factory's "Dropped invalid example")
  int64_t dropped_tokens = 0;  // pretraining with packing: the tail that fills no whole block
};

struct TokenizedDataset {
  std::vector<TokenizedSample> samples;
  PreprocessStats stats;
};

struct SupervisedOptions {
  int64_t cutoff_len = 2048;
  bool train_on_prompt = false;
  bool mask_history = false;  // train on the last turn only (incompatible with train_on_prompt)
};

// Whether preprocess_supervised makes a sample of the example (pre-tokenised, or a prompt of odd
// length and one response); LLaMA-Factory drops the others as invalid.
bool is_supervised_example(const Example& example);

// SupervisedDatasetProcessor._encode_data_example for one valid example (prompt of odd length,
// one response). `truncated` (optional) reports whether cutoff_len cut anything.
TokenizedSample encode_supervised_example(const ChatTemplate& chat, const Example& example,
                                          const SupervisedOptions& options, bool* truncated = nullptr);

// Every example; invalid ones are skipped and counted, pre-tokenised ones pass through unchanged.
TokenizedDataset preprocess_supervised(const std::vector<Example>& examples, const ChatTemplate& chat,
                                       const SupervisedOptions& options);

struct PretrainOptions {
  int64_t cutoff_len = 2048;
  // LLaMA-Factory turns packing on for the pt stage unless told otherwise. Note: when a user sets
  // `packing: true` explicitly, LLaMA-Factory's DataArguments also lowers cutoff_len by one; the
  // caller applies that before calling here.
  bool packing = true;
  // LLaMA-Factory's preprocessing_batch_size: packing never joins texts of different batches, and
  // each batch's tail that fills no whole block is dropped.
  int64_t batch_size = 1000;
};

// text + eos per example ("<|end_of_text|>" under the llama3 template, else the tokenizer's eos
// after the template's fix-ups); with packing each batch's texts concatenated and cut into
// cutoff_len blocks (the remainder dropped), bos written over each block's first token when the tokenizer
// adds bos; without packing each text on its own, bos first when it adds bos, cut at cutoff_len.
// Labels equal input_ids. Pre-tokenised examples pass through unchanged as their own samples.
TokenizedDataset preprocess_pretrain(const std::vector<Example>& examples, const ChatTemplate& chat,
                                     const PretrainOptions& options);

struct PairwiseSample {
  TokenizedSample chosen;
  TokenizedSample rejected;
  size_t source = 0;  // the index of its example
};

struct PairwiseDataset {
  std::vector<PairwiseSample> samples;
  PreprocessStats stats;  // tokens count chosen + rejected
};

// PairwiseDatasetProcessor: prompt + chosen and prompt + rejected, the prompt masked, one cutoff
// shared so both keep the same prompt. Needs a prompt of odd length and at least two responses.
PairwiseDataset preprocess_pairwise(const std::vector<Example>& examples, const ChatTemplate& chat,
                                    int64_t cutoff_len);

// Stages grpo and ppo (verl's RLHFDataset): per example, the prompt through the template up to and
// with the assistant header (encode_oneturn: every earlier turn included), its labels -100, then
// the reference answer (the last response; eos appended under efficient_eos) whole, as labels: the
// rewards compare with it, the model never reads it. A prompt longer than cutoff_len is cut as
// `truncation` says (verl's data.truncation): "left" keeps its last cutoff_len tokens (the end of
// the question and the assistant header), "middle" its first cutoff_len / 2 and last
// cutoff_len - cutoff_len / 2; "error" cuts nothing, and any such prompt makes the whole call a
// UserError that counts them and names the longest. Cut prompts are counted in stats.truncated;
// pre-tokenised examples split at their first label that is not -100. Needs a prompt of odd
// length and one response (LLaMA-Factory's supervised check); other examples are skipped.
struct PromptOptions {
  int64_t cutoff_len = 2048;
  std::string truncation = "error";  // error, left or middle
  std::string stage = "grpo";        // for messages
};

// `sources` (optional) receives the index of each kept prompt's example.
TokenizedDataset preprocess_prompts(const std::vector<Example>& examples, const ChatTemplate& chat,
                                    const PromptOptions& options, std::vector<size_t>* sources = nullptr);

// KTO (processor/feedback.py FeedbackDatasetProcessor): each example's prompt + its response,
// and prompt + a mismatched response for the KL estimate: the response of the example before it
// in its preprocessing batch (the batch's last for its first), each cut by cutoff_len on its own.
struct FeedbackSample {
  TokenizedSample completion, kl;
  bool desirable = true;  // the kto_tag
};

struct FeedbackDataset {
  std::vector<FeedbackSample> samples;
  PreprocessStats stats;  // tokens count the completions
};

// batch_size: LLaMA-Factory's preprocessing_batch_size (the mismatch stays inside a batch).
FeedbackDataset preprocess_feedback(const std::vector<Example>& examples, const ChatTemplate& chat,
                                    int64_t cutoff_len, int64_t batch_size = 1000);

}  // namespace fab
