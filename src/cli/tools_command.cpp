// fabrica tokenize / generate / export.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>

#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "core/backend.h"
#include "core/error.h"
#include "core/file_write.h"
#include "dataset/template.h"
#include "dataset/tokenizer_encoder.h"
#include "infer/generate.h"
#include "infer/rollout.h"
#include "models/hf_model.h"
#include "models/peft_adapter.h"
#include "train/reward_model.h"
#include "train/finetuning.h"
#include "tokenizer/tokenizer.h"
#include "train/checkpoint.h"

namespace fab {
namespace fs = std::filesystem;

int run_tokenize(int argc, char** argv) {
  Args args(argc, argv, 2, {"tokenizer", "input"}, {"add-special-tokens"});
  FAB_USER_CHECK(args.has("tokenizer"), "usage: fabrica tokenize --tokenizer PATH [--input FILE] [--add-special-tokens]");
  const Tokenizer tokenizer = Tokenizer::load(args.get("tokenizer"));
  std::ifstream file;
  if (args.has("input")) {
    file.open(args.get("input"));
    FAB_USER_CHECK(file, "{}: cannot open", args.get("input"));
  }
  std::istream& in = args.has("input") ? file : std::cin;
  std::string line, out;
  while (std::getline(in, line)) {
    const std::vector<int32_t> ids = tokenizer.encode(line, args.flag("add-special-tokens"));
    out.assign(1, '[');
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i) out += ", ";
      out += std::to_string(ids[i]);
    }
    out += "]";
    std::puts(out.c_str());
  }
  return 0;
}

namespace {

// The conversation so far, rendered by the chat template up to the assistant's next turn.
std::vector<int32_t> templated_prompt(const Tokenizer& tokenizer, const std::string& template_name,
                                      std::vector<Message> messages, const std::string& system) {
  TokenizerEncoder encoder(tokenizer);
  TemplateOptions options;
  options.enable_thinking = false;
  ChatTemplate chat(get_template(template_name), encoder, options);
  messages.push_back({Role::assistant, ""});
  return chat.encode_oneturn(messages, system, "").first;
}

SamplingOptions sampling_from(const Args& args, const Tokenizer& tokenizer) {
  SamplingOptions o;
  constexpr int64_t kMostTokens = int64_t(1) << 30, kMostSeed = int64_t(1) << 53;
  o.max_new_tokens = args.get_integer("max-new-tokens", 128, 1, kMostTokens);
  o.temperature = args.get_number("temperature", 0.0, 0.0, HUGE_VAL);  // NaN fails the range too
  o.top_p = args.get_number("top-p", 1.0, 0.0, 1.0);
  o.top_k = args.get_integer("top-k", 0, 0, kMostTokens);
  o.seed = uint64_t(args.get_integer("seed", 0, 0, kMostSeed));
  if (tokenizer.eos_id()) o.stop_ids.push_back(*tokenizer.eos_id());
  return o;
}

// The model of `dir`, with the PEFT adapter of `adapter` on it when that is not empty; bf16
// computes with bf16 weights (as bf16 training does).
// `device`: a `device:` setting (cpu, cuda, auto).
std::unique_ptr<DecoderModel> model_for_generation(const std::string& dir, const std::string& adapter = "",
                                                   bool bf16 = false, const std::string& device = "cpu") {
  FAB_USER_CHECK(HfWeights::present(dir), "{}: no weights to generate with (config.json only)", dir);
  const ModelConfig config = load_model_config((fs::path(dir) / "config.json").string());
  DecoderOptions options(bf16 ? Precision::bf16 : Precision::fp32, false, config.max_position_embeddings);
  options.device = resolve_device(device);
  if (!adapter.empty()) use_lora(read_adapter_config(adapter), options);
  auto model = load_model_folder(dir, options);
  if (!adapter.empty()) load_adapter(*model, adapter);
  return model;
}

// Generates and prints the new text as it becomes complete UTF-8; returns it.
std::string stream_reply(DecoderModel& model, const Tokenizer& tokenizer, const std::vector<int32_t>& prompt,
                         const SamplingOptions& o) {
  std::vector<int32_t> generated;
  std::string printed;
  generate(model, prompt, o, [&](int32_t token) {
    generated.push_back(token);
    const std::string text = tokenizer.decode(generated, true);
    if (text.size() > printed.size() && text.compare(0, printed.size(), printed) == 0) {
      std::fputs(text.c_str() + printed.size(), stdout);
      std::fflush(stdout);
      printed = text;
    }
  });
  std::puts("");
  return tokenizer.decode(generated, true);
}

const std::set<std::string> kSamplingFlags = {"model", "adapter", "template", "system", "max-new-tokens",
                                              "temperature", "top-p", "top-k", "seed", "device"};

// A user turn through --template, or the text as it is.
std::vector<int32_t> prompt_tokens(const Args& args, const Tokenizer& tokenizer, const std::string& text,
                                   const std::string& system) {
  return args.has("template") ? templated_prompt(tokenizer, args.get("template"), {{Role::user, text}}, system)
                              : tokenizer.encode(text, true);
}

struct PromptLine {
  std::string prompt, system;
};

// --prompts FILE: one JSON object a line with "prompt" (and optionally "system"); blank lines skipped.
std::vector<PromptLine> read_prompt_lines(const std::string& path, const std::string& default_system) {
  std::ifstream in(path);
  FAB_USER_CHECK(in, "{}: cannot open", path);
  std::vector<PromptLine> lines;
  int64_t number = 0;
  for (std::string line; std::getline(in, line);) {
    ++number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    FAB_USER_CHECK(j.is_object() && j.contains("prompt") && j["prompt"].is_string(),
                   "{} line {}: expected a JSON object with a string \"prompt\"", path, number);
    FAB_USER_CHECK(!j.contains("system") || j["system"].is_string(), "{} line {}: \"system\" must be a string",
                   path, number);
    lines.push_back({j["prompt"].get<std::string>(), j.value("system", default_system)});
  }
  FAB_USER_CHECK(!lines.empty(), "{}: no prompts", path);
  return lines;
}

// Batched: every prompt of --prompts through the rollout engine, --batch at a time; prompt i
// samples with seed --seed + i. Writes one JSON line per prompt, in order, to --output.
int generate_batched(const Args& args, const Tokenizer& tokenizer, const SamplingOptions& o) {
  FAB_USER_CHECK(args.has("output"), "fabrica generate --prompts needs --output FILE.jsonl");
  const std::vector<PromptLine> lines = read_prompt_lines(args.get("prompts"), args.get("system"));
  const int64_t batch = args.get_integer("batch", 16, 1, 1 << 16);
  std::vector<RolloutRequest> requests;
  for (size_t i = 0; i < lines.size(); ++i)
    requests.push_back({prompt_tokens(args, tokenizer, lines[i].prompt, lines[i].system), o.seed + i});
  auto model = model_for_generation(args.get("model"), args.get("adapter", ""), args.flag("bf16"),
                                    args.get("device", "cpu"));
  RolloutStats stats;
  const std::vector<RolloutOutput> outputs = rollout(*model, requests, o, batch, &stats);
  std::string text;
  for (size_t i = 0; i < outputs.size(); ++i) {
    const nlohmann::json j = {{"prompt", lines[i].prompt},
                              {"response", tokenizer.decode(outputs[i].tokens, true)},
                              {"tokens", outputs[i].tokens.size()},
                              {"stopped", outputs[i].stopped}};
    text += j.dump() + "\n";
  }
  write_file_atomically(args.get("output"), text);
  std::printf("generated %zu responses, %lld tokens in %.2f s (%.0f tokens/s, up to %lld at a time) -> %s\n",
              outputs.size(), static_cast<long long>(stats.generated_tokens), stats.seconds,
              double(stats.generated_tokens) / std::max(stats.seconds, 1e-9), static_cast<long long>(stats.peak_batch),
              args.get("output").c_str());
  return 0;
}

}  // namespace

int run_generate(int argc, char** argv) {
  std::set<std::string> flags = kSamplingFlags;
  flags.insert({"prompt", "prompts", "output", "batch"});
  Args args(argc, argv, 2, flags, {"bf16"});
  FAB_USER_CHECK(args.has("model") && args.has("prompt") != args.has("prompts"),
                 "usage: fabrica generate --model DIR (--prompt TEXT | --prompts FILE.jsonl --output OUT.jsonl "
                 "[--batch N]) [--adapter PEFT_DIR] [--template NAME] [--system TEXT] [--bf16] "
                 "[--max-new-tokens N] [--temperature T --top-p P --top-k K --seed S] [--device cpu|cuda|auto]\n"
                 "example: fabrica generate --model saves/qwen3-sft --template qwen3_nothink --prompt 'Hi'");
  const std::string dir = args.get("model");
  const Tokenizer tokenizer = Tokenizer::load(dir);
  const SamplingOptions o = sampling_from(args, tokenizer);
  if (args.has("prompts")) return generate_batched(args, tokenizer, o);
  const std::vector<int32_t> prompt = prompt_tokens(args, tokenizer, args.get("prompt"), args.get("system"));
  auto model = model_for_generation(dir, args.get("adapter", ""), args.flag("bf16"), args.get("device", "cpu"));
  stream_reply(*model, tokenizer, prompt, o);
  return 0;
}

// Interactive, multi-turn: each turn re-renders the whole conversation with the template.
int run_chat(int argc, char** argv) {
  Args args(argc, argv, 2, kSamplingFlags, {});
  FAB_USER_CHECK(args.has("model") && args.has("template"),
                 "usage: fabrica chat --model DIR --template NAME [--system TEXT] [--max-new-tokens N] "
                 "[--temperature T --top-p P --top-k K --seed S] [--device cpu|cuda|auto]\n"
                 "example: fabrica chat --model saves/qwen3-sft --template qwen3_nothink   (/clear resets, "
                 "an empty line or end of input quits)");
  const std::string dir = args.get("model");
  const Tokenizer tokenizer = Tokenizer::load(dir);
  const SamplingOptions o = sampling_from(args, tokenizer);
  auto model = model_for_generation(dir, args.get("adapter", ""), false, args.get("device", "cpu"));
  get_template(args.get("template"));  // an unknown name fails before the first prompt
  std::vector<Message> history;
  for (std::string line;;) {
    std::fputs("user> ", stdout);
    std::fflush(stdout);
    if (!std::getline(std::cin, line) || line.empty()) break;
    if (line == "/clear") {
      history.clear();
      continue;
    }
    history.push_back({Role::user, line});
    std::fputs("assistant> ", stdout);
    const std::string reply =
        stream_reply(*model, tokenizer, templated_prompt(tokenizer, args.get("template"), history, args.get("system")), o);
    history.push_back({Role::assistant, reply});
  }
  return 0;
}

namespace {

bool holds_model(const fs::path& folder) {
  return fs::exists(folder / "config.json") || HfWeights::present(folder.string());
}

}  // namespace

// A LoRA adapter folder merged into its base: W + scaling B A, saved as a full HF folder; a
// reward model's (stage rm) with its value head, into value_head.safetensors.
void export_merged(const std::string& base, const std::string& adapter, const std::string& to) {
  std::unique_ptr<DecoderModel> model;
  if (holds_value_head(adapter)) {
    model = load_reward_model(adapter, "--checkpoint ", base);  // merged, value head and all
  } else {
    model = model_for_generation(base, adapter);
    merge_adapters(*model);
  }
  save_model_folder(*model, to);
  copy_tokenizer_and_template_files(base, to);
  std::printf("merged adapter %s into %s: exported to %s\n", adapter.c_str(), base.c_str(), to.c_str());
}

// fabrica export --checkpoint DIR --output DIR: a checkpoint (or a LoRA adapter folder, merged
// into --base or its base_model_name_or_path) as an HF folder; or, as llamafactory-cli export, a
// YAML with model_name_or_path, adapter_name_or_path and export_dir.
int run_export(int argc, char** argv) {
  if (argc == 3 && std::string(argv[2]).find("--") != 0) {
    const YAML::Node y = YAML::LoadFile(argv[2]);
    for (const char* key : {"model_name_or_path", "adapter_name_or_path", "export_dir"})
      FAB_USER_CHECK(y[key] && y[key].IsScalar(), "{}: export needs {}", argv[2], key);
    const std::string to = y["export_dir"].as<std::string>();
    FAB_USER_CHECK(!holds_model(to), "export_dir {} already holds a model", to);
    export_merged(y["model_name_or_path"].as<std::string>(), y["adapter_name_or_path"].as<std::string>(), to);
    return 0;
  }
  Args args(argc, argv, 2, {"checkpoint", "output", "tokenizer-from", "base"}, {"overwrite"});
  FAB_USER_CHECK(args.has("checkpoint") && args.has("output"),
                 "usage: fabrica export --checkpoint DIR --output DIR [--base MODEL_DIR] [--tokenizer-from MODEL_DIR] "
                 "[--overwrite]   or   fabrica export EXPORT.yaml (model_name_or_path, adapter_name_or_path, export_dir)");
  const std::string from = args.get("checkpoint"), to = args.get("output");
  FAB_USER_CHECK(args.flag("overwrite") || !holds_model(to),
                 "--output {} already holds a model: pass --overwrite to replace it", to);
  if (is_adapter_folder(from)) {
    std::string base;
    read_adapter_config(from, &base);
    base = args.get("base", base);
    FAB_USER_CHECK(!base.empty(), "--checkpoint {} is a LoRA adapter without base_model_name_or_path: pass --base", from);
    export_merged(base, from, to);
    return 0;
  }
  FAB_USER_CHECK(HfWeights::present(from), "--checkpoint {}: no model.safetensors there (nothing to export)", from);
  DecoderOptions options;
  options.value_head = holds_value_head(from);  // a reward model keeps its value head
  auto model = load_model_folder(from, options);
  save_model_folder(*model, to);
  const std::string tokenizer_dir = args.get("tokenizer-from", from);
  copy_tokenizer_and_template_files(tokenizer_dir, to);
  std::printf("exported %s to %s\n", from.c_str(), to.c_str());
  return 0;
}

}  // namespace fab
