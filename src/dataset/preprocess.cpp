#include "dataset/preprocess.h"

#include <algorithm>
#include <optional>
#include <tuple>

#include "core/error.h"
#include "core/parallel_map.h"

namespace fab {

namespace {

void append(std::vector<int32_t>* to, const std::vector<int32_t>& from) {
  to->insert(to->end(), from.begin(), from.end());
}

void prepend(std::vector<int32_t>* to, const std::vector<int32_t>& from) {
  to->insert(to->begin(), from.begin(), from.end());
}

std::vector<int32_t> head(const std::vector<int32_t>& ids, int64_t n) {
  return {ids.begin(), ids.begin() + std::min<int64_t>(n, static_cast<int64_t>(ids.size()))};
}

void check_cutoff(int64_t cutoff_len) {
  FAB_USER_CHECK(cutoff_len > 0, "cutoff_len must be positive, got {}", cutoff_len);
}

void count(PreprocessStats* stats, const TokenizedSample& sample) {
  ++stats->samples;
  stats->tokens += static_cast<int64_t>(sample.input_ids.size());
}

// fn(), with a UserError from the template or the tokenizer prefixed by the example's file and
// record: "data/x.json: record 7: invalid JSON in tool description: ...".
template <typename Fn>
auto naming_the_record(const Example& example, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const UserError& e) {
    const std::string where = example.origin.where();
    if (where.empty()) throw;
    throw UserError(fab::format("{}: {}", where, e.what()));
  }
}

std::vector<Message> conversation(const Example& example) {
  std::vector<Message> messages = example.prompt;
  messages.insert(messages.end(), example.response.begin(), example.response.end());
  return messages;
}

// The labels of one turn's source (supervised.py): the source itself with train_on_prompt; with
// efficient_eos, later turns' sources begin with the eos that ends the previous answer; else masked.
std::vector<int32_t> source_labels(const ChatTemplate& chat, const std::vector<int32_t>& source, size_t turn,
                                   bool train_on_prompt) {
  if (train_on_prompt) return source;
  std::vector<int32_t> labels(source.size(), kIgnoreIndex);
  if (chat.spec().efficient_eos && turn != 0 && !labels.empty()) labels[0] = chat.eos_id();
  return labels;
}

}  // namespace

std::pair<int64_t, int64_t> infer_seqlen(int64_t source_len, int64_t target_len, int64_t cutoff_len) {
  int64_t max_target_len;
  if (target_len * 2 < cutoff_len) {
    max_target_len = cutoff_len;
  } else if (source_len * 2 < cutoff_len) {
    max_target_len = cutoff_len - source_len;
  } else {  // int(cutoff_len * (target_len / (source_len + target_len))) in double precision
    max_target_len =
        static_cast<int64_t>(static_cast<double>(cutoff_len) *
                             (static_cast<double>(target_len) / static_cast<double>(source_len + target_len)));
  }
  int64_t new_target_len = std::min(max_target_len, target_len);
  int64_t max_source_len = std::max<int64_t>(cutoff_len - new_target_len, 0);
  int64_t new_source_len = std::min(max_source_len, source_len);
  return {new_source_len, new_target_len};
}

TokenizedSample encode_supervised_example(const ChatTemplate& chat, const Example& example,
                                          const SupervisedOptions& options, bool* truncated) {
  check_cutoff(options.cutoff_len);
  FAB_USER_CHECK(!(options.mask_history && options.train_on_prompt),
                 "mask_history is incompatible with train_on_prompt");
  FAB_USER_CHECK(!(options.train_on_prompt && chat.spec().efficient_eos),
                 "template '{}' does not support train_on_prompt", chat.spec().name);
  bool discarding_history_cot = options.mask_history && !chat.spec().preserve_thinking;
  std::vector<TurnIds> turns =
      chat.encode_multiturn(conversation(example), example.system, example.tools, discarding_history_cot);
  if (options.mask_history) std::reverse(turns.begin(), turns.end());  // the last turns matter most

  bool efficient_eos = chat.spec().efficient_eos;
  int64_t total_length = efficient_eos ? 1 : 0;
  bool cut = false;
  TokenizedSample out;
  for (size_t turn = 0; turn < turns.size(); ++turn) {
    if (total_length >= options.cutoff_len) {
      cut = true;
      break;
    }
    const auto& [full_source, full_target] = turns[turn];
    auto [source_len, target_len] =
        infer_seqlen(static_cast<int64_t>(full_source.size()), static_cast<int64_t>(full_target.size()),
                     options.cutoff_len - total_length);
    cut |=
        source_len < static_cast<int64_t>(full_source.size()) || target_len < static_cast<int64_t>(full_target.size());
    std::vector<int32_t> source = head(full_source, source_len), target = head(full_target, target_len);
    total_length += source_len + target_len;

    std::vector<int32_t> source_label = source_labels(chat, source, turn, options.train_on_prompt);
    // mask_history: only the last turn (first after reversing) is trained on.
    std::vector<int32_t> target_label =
        options.mask_history && turn != 0 ? std::vector<int32_t>(target.size(), kIgnoreIndex) : target;
    std::vector<int32_t> ids = source, labels = source_label;
    append(&ids, target);
    append(&labels, target_label);
    if (options.mask_history) {  // turns come last-first, so each goes in front
      prepend(&out.input_ids, ids);
      prepend(&out.labels, labels);
    } else {
      append(&out.input_ids, ids);
      append(&out.labels, labels);
    }
  }
  if (efficient_eos) {
    out.input_ids.push_back(chat.eos_id());
    out.labels.push_back(chat.eos_id());
  }
  if (truncated) *truncated = cut;
  return out;
}

namespace {

// One example's outcome, computed on any thread and counted afterwards in example order.
struct SupervisedOutcome {
  bool kept = false;
  bool truncated = false;
  TokenizedSample sample;
};

SupervisedOutcome supervised_outcome(const ChatTemplate& chat, const Example& example,
                                     const SupervisedOptions& options) {
  SupervisedOutcome outcome;
  if (example.pretokenized) {
    outcome.kept = true;
    outcome.sample = {example.input_ids, example.labels};
  } else if (is_supervised_example(example)) {
    outcome.kept = true;
    outcome.sample = naming_the_record(
        example, [&] { return encode_supervised_example(chat, example, options, &outcome.truncated); });
  }  // else LLaMA-Factory's "Dropped invalid example"
  return outcome;
}

}  // namespace

bool is_supervised_example(const Example& example) {
  return example.pretokenized || (example.prompt.size() % 2 == 1 && example.response.size() == 1);
}

TokenizedDataset preprocess_supervised(const std::vector<Example>& examples, const ChatTemplate& chat,
                                       const SupervisedOptions& options) {
  std::vector<SupervisedOutcome> outcomes =
      parallel_map(examples.size(), [&](size_t i) { return supervised_outcome(chat, examples[i], options); });
  TokenizedDataset out;
  out.samples.reserve(outcomes.size());
  for (SupervisedOutcome& outcome : outcomes) {
    if (!outcome.kept) {
      ++out.stats.skipped;
      continue;
    }
    out.stats.truncated += outcome.truncated ? 1 : 0;
    out.samples.push_back(std::move(outcome.sample));
    count(&out.stats, out.samples.back());
  }
  return out;
}

namespace {

// LLaMA-Factory appends the eos *text*, then tokenises: "<|end_of_text|>" for llama3, else the
// tokenizer's eos token after the template's fix-ups (replace_eos).
std::string pretrain_eos_text(const ChatTemplate& chat) {
  return chat.spec().name == "llama3" ? std::string("<|end_of_text|>") : chat.eos_token();
}

void pack_blocks(const std::vector<int32_t>& stream, const ChatTemplate& chat, int64_t block, TokenizedDataset* out) {
  std::optional<int32_t> bos = chat.encoder().add_bos_token() ? chat.encoder().bos_id() : std::nullopt;
  int64_t usable = static_cast<int64_t>(stream.size()) / block * block;
  out->stats.dropped_tokens += static_cast<int64_t>(stream.size()) - usable;
  for (int64_t start = 0; start < usable; start += block) {
    TokenizedSample sample;
    sample.input_ids.assign(stream.begin() + start, stream.begin() + start + block);
    if (bos) sample.input_ids[0] = *bos;  // LLaMA-Factory overwrites, not inserts
    sample.labels = sample.input_ids;
    out->samples.push_back(std::move(sample));
    count(&out->stats, out->samples.back());
  }
}

// One unpacked text: cut at cutoff_len (truncation=True, max_length=cutoff_len), labels = ids.
void add_unpacked(std::vector<int32_t> ids, int64_t cutoff_len, TokenizedDataset* out) {
  if (static_cast<int64_t>(ids.size()) > cutoff_len) {
    ids.resize(static_cast<size_t>(cutoff_len));
    ++out->stats.truncated;
  }
  std::vector<int32_t> labels = ids;
  out->samples.push_back({std::move(ids), std::move(labels)});
  count(&out->stats, out->samples.back());
}

// Texts are tokenised this many at a time in parallel, which bounds the ids held besides the samples.
constexpr size_t kPretrainChunk = size_t(1) << 14;

}  // namespace

TokenizedDataset preprocess_pretrain(const std::vector<Example>& examples, const ChatTemplate& chat,
                                     const PretrainOptions& options) {
  check_cutoff(options.cutoff_len);
  FAB_USER_CHECK(options.batch_size > 0, "preprocessing batch size must be positive, got {}", options.batch_size);
  const TextEncoder& encoder = chat.encoder();
  const std::string eos_text = pretrain_eos_text(chat);
  std::string bos_text;
  if (!options.packing && encoder.add_bos_token() && encoder.bos_id())
    bos_text = encoder.id_to_token(*encoder.bos_id());  // packing writes bos over each block instead
  auto text_ids = [&](size_t i) {
    const Example& example = examples[i];
    if (example.pretokenized || example.prompt.empty()) return std::vector<int32_t>();
    return naming_the_record(example, [&] { return encoder.encode(bos_text + example.prompt[0].content + eos_text); });
  };

  TokenizedDataset out;
  std::vector<int32_t> stream;
  for (size_t begin = 0; begin < examples.size(); begin += kPretrainChunk) {
    const size_t end = std::min(examples.size(), begin + kPretrainChunk);
    std::vector<std::vector<int32_t>> encoded =
        parallel_map(end - begin, [&](size_t k) { return text_ids(begin + k); });
    for (size_t i = begin; i < end; ++i) {
      const Example& example = examples[i];
      if (example.pretokenized) {
        out.samples.push_back({example.input_ids, example.labels});
        count(&out.stats, out.samples.back());
      } else if (example.prompt.empty()) {
        ++out.stats.skipped;  // nothing to read the text from
      } else if (options.packing) {
        append(&stream, encoded[i - begin]);
      } else {
        add_unpacked(std::move(encoded[i - begin]), options.cutoff_len, &out);
      }
      // datasets.map(batched=True) hands the processor batch_size examples at a time, and packing
      // concatenates within one batch only.
      bool batch_end = (i + 1) % static_cast<size_t>(options.batch_size) == 0 || i + 1 == examples.size();
      if (options.packing && batch_end) {
        pack_blocks(stream, chat, options.cutoff_len, &out);
        stream.clear();
      }
    }
  }
  return out;
}

namespace {

// One preference example: prompt + chosen and prompt + rejected; nullopt when it is invalid.
std::optional<PairwiseSample> encode_pairwise_example(const ChatTemplate& chat, const Example& example,
                                                      int64_t cutoff_len, bool* truncated) {
  if (example.prompt.size() % 2 != 1 || example.response.size() < 2) return std::nullopt;
  std::vector<Message> chosen_messages = example.prompt, rejected_messages = example.prompt;
  chosen_messages.push_back(example.response[0]);
  rejected_messages.push_back(example.response[1]);
  auto [prompt_ids, chosen_ids] = chat.encode_oneturn(chosen_messages, example.system, example.tools);
  std::vector<int32_t> rejected_ids = chat.encode_oneturn(rejected_messages, example.system, example.tools).second;
  if (chat.spec().efficient_eos) {
    chosen_ids.push_back(chat.eos_id());
    rejected_ids.push_back(chat.eos_id());
  }
  int64_t longest = static_cast<int64_t>(std::max(chosen_ids.size(), rejected_ids.size()));
  auto [source_len, target_len] = infer_seqlen(static_cast<int64_t>(prompt_ids.size()), longest, cutoff_len);
  *truncated = source_len < static_cast<int64_t>(prompt_ids.size()) || target_len < longest;
  std::vector<int32_t> prompt = head(prompt_ids, source_len);
  PairwiseSample sample;
  for (auto [side, ids] : {std::pair{&sample.chosen, &chosen_ids}, std::pair{&sample.rejected, &rejected_ids}}) {
    side->input_ids = prompt;
    append(&side->input_ids, head(*ids, target_len));
    side->labels.assign(prompt.size(), kIgnoreIndex);
    append(&side->labels, head(*ids, target_len));
  }
  return sample;
}

}  // namespace

PairwiseDataset preprocess_pairwise(const std::vector<Example>& examples, const ChatTemplate& chat,
                                    int64_t cutoff_len) {
  check_cutoff(cutoff_len);
  std::vector<std::pair<std::optional<PairwiseSample>, bool>> outcomes = parallel_map(examples.size(), [&](size_t i) {
    bool truncated = false;
    std::optional<PairwiseSample> sample =
        naming_the_record(examples[i], [&] { return encode_pairwise_example(chat, examples[i], cutoff_len, &truncated); });
    return std::pair{std::move(sample), truncated};
  });
  PairwiseDataset out;
  for (size_t i = 0; i < outcomes.size(); ++i) {
    auto& [sample, truncated] = outcomes[i];
    if (!sample) {
      ++out.stats.skipped;
      continue;
    }
    sample->source = i;
    out.stats.truncated += truncated ? 1 : 0;
    out.stats.tokens += static_cast<int64_t>(sample->chosen.input_ids.size() + sample->rejected.input_ids.size());
    out.samples.push_back(std::move(*sample));
    ++out.stats.samples;
  }
  return out;
}

namespace {

// prompt + the first non-empty message of `response` (LLaMA-Factory builds a KTO response as
// [answer, ""] or ["", answer]), masked and cut like a supervised turn.
TokenizedSample encode_feedback_side(const ChatTemplate& chat, const Example& example,
                                     const std::vector<Message>& response, int64_t cutoff_len, bool* truncated) {
  std::vector<Message> messages = example.prompt;
  messages.push_back(!response[0].content.empty() ? response[0] : response[1]);
  auto [prompt_ids, response_ids] = chat.encode_oneturn(messages, example.system, example.tools);
  if (chat.spec().efficient_eos) response_ids.push_back(chat.eos_id());
  auto [source_len, target_len] = infer_seqlen(static_cast<int64_t>(prompt_ids.size()),
                                               static_cast<int64_t>(response_ids.size()), cutoff_len);
  if (truncated)
    *truncated = source_len < static_cast<int64_t>(prompt_ids.size()) ||
                 target_len < static_cast<int64_t>(response_ids.size());
  TokenizedSample out;
  out.input_ids = head(prompt_ids, source_len);
  out.labels.assign(out.input_ids.size(), kIgnoreIndex);
  const std::vector<int32_t> target = head(response_ids, target_len);
  append(&out.input_ids, target);
  append(&out.labels, target);
  return out;
}

}  // namespace

FeedbackDataset preprocess_feedback(const std::vector<Example>& examples, const ChatTemplate& chat,
                                    int64_t cutoff_len, int64_t batch_size) {
  check_cutoff(cutoff_len);
  const size_t batch = static_cast<size_t>(batch_size);
  auto kl_source = [&](size_t i) -> const Example& {  // the example before i in its batch, cyclically
    const size_t first = i / batch * batch, last = std::min(examples.size(), first + batch) - 1;
    return examples[i == first ? last : i - 1];
  };
  auto valid = [](const Example& e) { return e.prompt.size() % 2 == 1 && e.response.size() >= 2; };
  std::vector<std::pair<std::optional<FeedbackSample>, bool>> outcomes = parallel_map(examples.size(), [&](size_t i) {
    const Example& example = examples[i];
    if (!valid(example) || kl_source(i).response.size() < 2) return std::pair{std::optional<FeedbackSample>(), false};
    bool truncated = false;
    FeedbackSample sample = naming_the_record(example, [&] {
      return FeedbackSample{encode_feedback_side(chat, example, example.response, cutoff_len, &truncated),
                            encode_feedback_side(chat, example, kl_source(i).response, cutoff_len, nullptr),
                            !example.response[0].content.empty()};
    });
    return std::pair{std::optional<FeedbackSample>(std::move(sample)), truncated};
  });
  FeedbackDataset out;
  for (auto& [sample, truncated] : outcomes) {
    if (!sample) {
      ++out.stats.skipped;
      continue;
    }
    out.stats.truncated += truncated ? 1 : 0;
    count(&out.stats, sample->completion);
    out.samples.push_back(std::move(*sample));
  }
  return out;
}

namespace {

// One example of preprocess_prompts: its prompt (cut when `truncation` allows) and answer, and its
// prompt's length before any cut.
struct PromptOutcome {
  bool kept = false;
  int64_t prompt_length = 0;
  bool truncated = false;
  TokenizedSample sample;
};

// verl's RLHFDataset truncation of a prompt of more than `cutoff_len` tokens.
std::vector<int32_t> cut_prompt(const std::vector<int32_t>& prompt, int64_t cutoff_len, const std::string& truncation) {
  const auto n = static_cast<std::ptrdiff_t>(cutoff_len);
  if (truncation == "left") return {prompt.end() - n, prompt.end()};
  std::vector<int32_t> out(prompt.begin(), prompt.begin() + n / 2);  // middle
  out.insert(out.end(), prompt.end() - (n - n / 2), prompt.end());
  return out;
}

PromptOutcome prompt_outcome(const ChatTemplate& chat, const Example& example, const PromptOptions& options) {
  PromptOutcome o;
  std::vector<int32_t> prompt, answer;
  if (example.pretokenized) {
    size_t first = 0;
    while (first < example.labels.size() && example.labels[first] == kIgnoreIndex) ++first;
    prompt.assign(example.input_ids.begin(), example.input_ids.begin() + static_cast<std::ptrdiff_t>(first));
    answer.assign(example.input_ids.begin() + static_cast<std::ptrdiff_t>(first), example.input_ids.end());
  } else if (example.prompt.size() % 2 == 1 && example.response.size() == 1) {
    std::vector<Message> messages = example.prompt;
    messages.push_back(example.response[0]);
    std::tie(prompt, answer) =
        naming_the_record(example, [&] { return chat.encode_oneturn(messages, example.system, example.tools); });
    if (chat.spec().efficient_eos) answer.push_back(chat.eos_id());
  } else {
    return o;  // LLaMA-Factory's "Dropped invalid example"
  }
  o.kept = true;
  o.prompt_length = static_cast<int64_t>(prompt.size());
  if (o.prompt_length > options.cutoff_len && options.truncation != "error") {
    prompt = cut_prompt(prompt, options.cutoff_len, options.truncation);
    o.truncated = true;
  }
  o.sample.input_ids = prompt;
  o.sample.labels.assign(prompt.size(), kIgnoreIndex);
  append(&o.sample.input_ids, answer);
  append(&o.sample.labels, answer);
  return o;
}

}  // namespace

TokenizedDataset preprocess_prompts(const std::vector<Example>& examples, const ChatTemplate& chat,
                                    const PromptOptions& options, std::vector<size_t>* sources) {
  check_cutoff(options.cutoff_len);
  FAB_USER_CHECK(options.truncation == "error" || options.truncation == "left" || options.truncation == "middle",
                 "truncation \"{}\" must be error, left or middle", options.truncation);
  std::vector<PromptOutcome> outcomes =
      parallel_map(examples.size(), [&](size_t i) { return prompt_outcome(chat, examples[i], options); });
  TokenizedDataset out;
  int64_t too_long = 0;
  size_t longest = 0;
  for (size_t i = 0; i < outcomes.size(); ++i) {
    PromptOutcome& o = outcomes[i];
    if (!o.kept) {
      ++out.stats.skipped;
      continue;
    }
    if (o.prompt_length > options.cutoff_len) {
      ++too_long;
      if (o.prompt_length > outcomes[longest].prompt_length || !outcomes[longest].kept) longest = i;
    }
    out.stats.truncated += o.truncated ? 1 : 0;
    out.samples.push_back(std::move(o.sample));
    if (sources) sources->push_back(i);
    count(&out.stats, out.samples.back());
  }
  if (too_long > 0 && options.truncation == "error") {
    const std::string where = examples[longest].origin.where();
    throw UserError(fab::format(
        "stage {}: {} of {} prompts are longer than cutoff_len {} tokens (template included; the longest{} has {}); "
        "a prompt is never cut unless you say how, since cutting its end loses the question and the assistant "
        "header: raise cutoff_len, or set truncation: left (keep each one's last cutoff_len tokens) or middle (its "
        "first and last halves), as verl's data.truncation",
        options.stage, too_long, out.samples.size(), options.cutoff_len, where.empty() ? "" : " (" + where + ")",
        outcomes[longest].prompt_length));
  }
  return out;
}

}  // namespace fab
