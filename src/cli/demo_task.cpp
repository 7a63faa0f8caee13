#include "cli/demo_task.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "core/file_write.h"
#include "dataset/template.h"
#include "dataset/tokenizer_encoder.h"
#include "infer/rollout.h"
#include "models/hf_model.h"
#include "tokenizer/bpe_trainer.h"

namespace fab {

void write_alpaca(const std::string& path, const std::vector<Problem>& problems) {
  nlohmann::json records = nlohmann::json::array();
  for (const Problem& p : problems) records.push_back({{"instruction", p.question}, {"input", ""}, {"output", p.answer}});
  write_file_atomically(path, records.dump(1) + "\n");
}

namespace {

void write_model_config(const std::string& dir, int64_t vocab) {
  const nlohmann::json config = {{"architectures", {"Qwen3ForCausalLM"}},
                                 {"model_type", "qwen3"},
                                 {"vocab_size", vocab},
                                 {"hidden_size", 128},
                                 {"intermediate_size", 352},
                                 {"num_hidden_layers", 3},
                                 {"num_attention_heads", 4},
                                 {"num_key_value_heads", 2},
                                 {"head_dim", 32},
                                 {"max_position_embeddings", 64},
                                 {"rope_theta", 10000.0},
                                 {"rms_norm_eps", 1e-6},
                                 {"tie_word_embeddings", true}};
  write_file_atomically(dir + "/config.json", config.dump(2) + "\n");
}

}  // namespace

Tokenizer make_tiny_model_folder(const std::string& dir, const std::vector<Problem>& problems, int64_t vocab_size) {
  BpeTrainer bpe_trainer(BpeTrainerOptions{vocab_size, 2, default_special_tokens()});
  for (const Problem& p : problems) bpe_trainer.add_text(p.question + p.answer + "\n");
  save_bpe_tokenizer(bpe_trainer.train(), dir);
  Tokenizer tokenizer = Tokenizer::load(dir);
  write_model_config(dir, tokenizer.vocab_size());
  return tokenizer;
}

std::unique_ptr<DecoderModel> load_tiny_model(const std::string& dir, uint64_t seed) {
  return load_model_folder(dir, {Precision::fp32, false, 64}, seed);
}

double greedy_accuracy(DecoderModel& model, const Tokenizer& tokenizer, const std::vector<Problem>& problems,
                       size_t show, int64_t max_new_tokens) {
  TokenizerEncoder encoder(tokenizer);
  ChatTemplate chat(get_template("chatml"), encoder);
  SamplingOptions greedy;
  greedy.max_new_tokens = max_new_tokens;
  greedy.stop_ids = {*tokenizer.eos_id()};
  std::vector<RolloutRequest> requests;
  for (const Problem& p : problems)
    requests.push_back({chat.encode_oneturn({{Role::user, p.question}, {Role::assistant, ""}}, "", "").first, 0});
  const std::vector<RolloutOutput> outputs = rollout(model, requests, greedy, 32);
  size_t right = 0;
  for (size_t i = 0; i < problems.size(); ++i) {
    const std::string answer = tokenizer.decode(outputs[i].tokens, true);
    right += answer == problems[i].answer;
    if (i < show) {
      const std::string verdict = answer == problems[i].answer ? "right" : "wrong, expected " + problems[i].answer;
      std::printf("  %s -> %-5s %s\n", problems[i].question.c_str(), answer.c_str(), verdict.c_str());
    }
  }
  return problems.empty() ? 0.0 : double(right) / double(problems.size());
}

std::string demo_common_yaml(const std::string& model, const std::string& dataset, const std::string& output_dir,
                        const std::string& cache_dir, int steps) {
  return "model_name_or_path: " + model + "\ndataset: " + dataset + "\ntemplate: chatml\ncutoff_len: 32\noutput_dir: " +
         output_dir + "\noverwrite_output_dir: true\nmax_steps: " + std::to_string(steps) +
         "\nlogging_steps: " + std::to_string(std::max(1, steps / 10)) + "\nsave_steps: 0\nseed: 7\ncache_dir: " +
         cache_dir + "\n";
}

std::string demo_sft_yaml(const std::string& model, const std::string& dataset, const std::string& output_dir,
                          const std::string& cache_dir, int steps) {
  return demo_common_yaml(model, dataset, output_dir, cache_dir, steps) +
         "stage: sft\nper_device_train_batch_size: 32\nlearning_rate: 3.0e-3\nlr_scheduler_type: cosine\n"
         "warmup_ratio: 0.05\nweight_decay: 0.01\n";
}

std::string demo_grpo_yaml(const std::string& model, const std::string& dataset, const std::string& output_dir,
                           const std::string& cache_dir, int steps, const std::string& extra) {
  return demo_common_yaml(model, dataset, output_dir, cache_dir, steps) +
         "stage: grpo\nreward: exact_match\nper_device_train_batch_size: 8\nnum_generations: 8\n"
         "temperature: 1.0\ntop_p: 1.0\ntop_k: 0\nmax_new_tokens: 6\nlearning_rate: 1.0e-4\n"
         "lr_scheduler_type: constant\n" + extra;
}

}  // namespace fab
