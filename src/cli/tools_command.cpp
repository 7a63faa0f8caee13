// fabrica tokenize / generate / export.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <set>
#include <tuple>

#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/export_config.h"
#include "cli/generation_prompt.h"
#include "cli/model_folders.h"
#include "config/yaml_file.h"
#include "core/backend.h"
#include "core/error.h"
#include "core/file_write.h"
#include "dataset/multimodal.h"
#include "dataset/template.h"
#include "infer/generate.h"
#include "infer/rollout.h"
#include "launch/output_dir_lock.h"
#include "models/hf_model.h"
#include "models/peft_adapter.h"
#include "train/stages/reward_model.h"
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
  if (!adapter.empty()) {
    require_folder("--adapter", adapter);
    FAB_USER_CHECK(is_adapter_folder(adapter), "--adapter {}: no adapter_config.json there (expected a PEFT LoRA "
                   "adapter folder)", adapter);
  }
  const ModelConfig config = load_model_config((fs::path(dir) / "config.json").string());
  DecoderOptions options(bf16 ? Precision::bf16 : Precision::fp32, false, config.max_position_embeddings);
  options.device = resolve_device(device);
  if (!adapter.empty()) use_lora(read_adapter_config(adapter), options);
  auto model = load_model_folder(dir, options);
  if (!adapter.empty()) load_adapter(*model, adapter);
  return model;
}

// Generates and prints the new text as it becomes complete UTF-8; returns it.
std::string stream_reply(DecoderModel& model, const Tokenizer& tokenizer, const GenerationPrompt& prompt,
                         const SamplingOptions& o) {
  std::vector<int32_t> generated;
  std::string printed;
  const auto print = [&](int32_t token) {
    generated.push_back(token);
    const std::string text = tokenizer.decode(generated, true);
    if (text.size() > printed.size() && text.compare(0, printed.size(), printed) == 0) {
      std::fputs(text.c_str() + printed.size(), stdout);
      std::fflush(stdout);
      printed = text;
    }
  };
  generate(model, prompt.tokens, o, print, prompt.images);
  std::puts("");
  return tokenizer.decode(generated, true);
}

const std::set<std::string> kSamplingFlags = {"model",  "adapter", "template", "system", "max-new-tokens",
                                              "temperature", "top-p", "top-k", "seed", "device",
                                              "image-max-pixels", "image-min-pixels"};

// --image-max-pixels / --image-min-pixels: the pre-resize bounds of LLaMA-Factory's image_max_pixels
// and image_min_pixels (set them as the model was trained with; the defaults are LLaMA-Factory's).
ImagePixelBounds pixel_bounds_from(const Args& args) {
  ImagePixelBounds b;
  b.max_pixels = args.get_integer("image-max-pixels", b.max_pixels, 1, int64_t(1) << 40);
  b.min_pixels = args.get_integer("image-min-pixels", b.min_pixels, 1, b.max_pixels);
  return b;
}

// --image A.jpg,B.png: the files, in order.
std::vector<std::string> image_paths(const std::string& list) {
  std::vector<std::string> paths;
  for (size_t from = 0; from <= list.size();) {
    const size_t comma = std::min(list.find(',', from), list.size());
    FAB_USER_CHECK(comma > from, "--image {}: an empty file name (expected FILE or FILE,FILE,...)", list);
    paths.push_back(list.substr(from, comma - from));
    from = comma + 1;
  }
  return paths;
}

// A user turn (with its images) through --template, or the text as it is.
GenerationPrompt prompt_of(const Args& args, const Tokenizer& tokenizer, const std::string& text,
                           const std::string& system, const std::vector<std::string>& images) {
  if (args.has("template"))
    return generation_prompt(tokenizer, args.get("model"), args.get("template"), {{Role::user, text}}, system, images,
                             pixel_bounds_from(args));
  FAB_USER_CHECK(images.empty(), "images need --template (qwen2_vl), which writes their vision tokens into the prompt");
  return {tokenizer.encode(text, true), {}};
}

struct PromptLine {
  std::string prompt, system;
  std::vector<std::string> images;
};

// --prompts FILE: one JSON object a line with "prompt" (and optionally "system" and "images", a list
// of files); blank lines skipped.
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
    const nlohmann::json images = j.value("images", nlohmann::json::array());
    FAB_USER_CHECK(images.is_array() && std::all_of(images.begin(), images.end(), [](const auto& i) { return i.is_string(); }),
                   "{} line {}: \"images\" must be a list of file names", path, number);
    lines.push_back({j["prompt"].get<std::string>(), j.value("system", default_system),
                     images.get<std::vector<std::string>>()});
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
  for (size_t i = 0; i < lines.size(); ++i) {
    GenerationPrompt prompt;
    try {
      prompt = prompt_of(args, tokenizer, lines[i].prompt, lines[i].system, lines[i].images);
    } catch (const UserError& e) {
      throw UserError(format("{} prompt {}: {}", args.get("prompts"), i + 1, e.what()));
    }
    requests.push_back({std::move(prompt.tokens), o.seed + i, prompt.images});
  }
  auto model = model_for_generation(args.get("model"), args.get("adapter", ""), args.flag("bf16"),
                                    args.get("device", "cpu"));
  RolloutStats stats;
  const std::vector<RolloutOutput> outputs = rollout(*model, requests, o, batch, &stats);
  std::string text;
  for (size_t i = 0; i < outputs.size(); ++i) {
    const nlohmann::json j = {{"prompt", lines[i].prompt},
                              {"prompt_tokens", requests[i].prompt.size()},
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
  flags.insert({"prompt", "prompts", "output", "batch", "image"});
  Args args(argc, argv, 2, flags, {"bf16"});
  FAB_USER_CHECK(args.has("model") && args.has("prompt") != args.has("prompts"),
                 "usage: fabrica generate --model DIR (--prompt TEXT [--image FILE[,FILE...]] | --prompts FILE.jsonl "
                 "--output OUT.jsonl [--batch N]) [--adapter PEFT_DIR] [--template NAME] [--system TEXT] [--bf16] "
                 "[--image-max-pixels N --image-min-pixels N] "
                 "[--max-new-tokens N] [--temperature T --top-p P --top-k K --seed S] [--device cpu|cuda|auto]\n"
                 "example: fabrica generate --model saves/qwen3-sft --template qwen3_nothink --prompt 'Hi'\n"
                 "         fabrica generate --model saves/qwen2-vl --template qwen2_vl --image cat.jpg --prompt "
                 "'What is in the picture?'");
  FAB_USER_CHECK(!args.has("image") || args.has("prompt"),
                 "--image goes with --prompt; with --prompts, give each line its \"images\"");
  const std::string dir = args.get("model");
  require_model_folder("--model", dir);
  const Tokenizer tokenizer = Tokenizer::load(dir);
  const SamplingOptions o = sampling_from(args, tokenizer);
  if (args.has("prompts")) return generate_batched(args, tokenizer, o);
  const GenerationPrompt prompt = prompt_of(args, tokenizer, args.get("prompt"), args.get("system"),
                                            args.has("image") ? image_paths(args.get("image")) : std::vector<std::string>());
  auto model = model_for_generation(dir, args.get("adapter", ""), args.flag("bf16"), args.get("device", "cpu"));
  stream_reply(*model, tokenizer, prompt, o);
  return 0;
}

// Interactive, multi-turn: each turn re-renders the whole conversation (and its images) with the
// template. `/image FILE` attaches an image to the next message (before its text, unless the message
// places it with <image>); `/clear` starts over.
int run_chat(int argc, char** argv) {
  Args args(argc, argv, 2, kSamplingFlags, {});
  FAB_USER_CHECK(args.has("model") && args.has("template"),
                 "usage: fabrica chat --model DIR --template NAME [--system TEXT] [--max-new-tokens N] "
                 "[--image-max-pixels N --image-min-pixels N] "
                 "[--temperature T --top-p P --top-k K --seed S] [--device cpu|cuda|auto]\n"
                 "example: fabrica chat --model saves/qwen3-sft --template qwen3_nothink   (/clear resets, "
                 "/image FILE attaches an image to the next message, an empty line or end of input quits)");
  const std::string dir = args.get("model");
  require_model_folder("--model", dir);
  const Tokenizer tokenizer = Tokenizer::load(dir);
  const SamplingOptions o = sampling_from(args, tokenizer);
  auto model = model_for_generation(dir, args.get("adapter", ""), false, args.get("device", "cpu"));
  get_template(args.get("template"));  // an unknown name fails before the first prompt
  std::vector<Message> history;
  std::vector<std::string> images, attached;  // the conversation's images; those for the next message
  for (std::string line;;) {
    std::fputs("user> ", stdout);
    std::fflush(stdout);
    if (!std::getline(std::cin, line) || line.empty()) break;
    if (line == "/clear") {
      history.clear(), images.clear(), attached.clear();
      continue;
    }
    if (line.rfind("/image ", 0) == 0) {
      attached.push_back(line.substr(7));
      continue;
    }
    if (line.find(kImagePlaceholder) == std::string::npos)
      for (size_t i = 0; i < attached.size(); ++i) line = kImagePlaceholder + line;
    history.push_back({Role::user, line});
    images.insert(images.end(), attached.begin(), attached.end());
    GenerationPrompt prompt;
    try {  // a bad image or placeholder costs this message, not the conversation
      prompt = generation_prompt(tokenizer, dir, args.get("template"), history, args.get("system"), images,
                                 pixel_bounds_from(args));
    } catch (const UserError& e) {
      std::printf("error: %s (the message is dropped)\n", e.what());
      history.pop_back();
      images.resize(images.size() - attached.size());
      attached.clear();
      continue;
    }
    attached.clear();
    std::fputs("assistant> ", stdout);
    history.push_back({Role::assistant, stream_reply(*model, tokenizer, prompt, o)});
  }
  return 0;
}

namespace {

bool holds_model(const fs::path& folder) {
  return fs::exists(folder / "config.json") || HfWeights::present(folder.string());
}

bool same_folder(const std::string& a, const std::string& b) {
  std::error_code error;
  return fs::exists(a) && fs::exists(b) && fs::equivalent(a, b, error);
}

// What one export reads and writes; each folder with the words that name it in messages (the
// flag, or the export YAML's key).
struct ExportJob {
  std::string from, from_name;  // a model or checkpoint folder, or a LoRA adapter folder
  std::string base, base_name;  // an adapter's base model ("": its base_model_name_or_path)
  std::string tokenizer_from;   // "": found by tokenizer_source
  std::string to, to_name;
  bool overwrite = false;
  size_t shard_bytes = size_t(5) << 30;
};

// The fields of config.json in which two models' architectures differ ("" when none does).
std::string architecture_differences(const ModelConfig& a, const ModelConfig& b) {
  std::string out;
  auto differ = [&](const char* field, const std::string& x, const std::string& y) {
    if (x != y) out += format("{}{} {}, not {}", out.empty() ? "" : ", ", field, x, y);
  };
  differ("model_type", a.model_type, b.model_type);
  for (const auto& [field, x, y] :
       {std::tuple{"hidden_size", a.hidden_size, b.hidden_size},
        std::tuple{"intermediate_size", a.intermediate_size, b.intermediate_size},
        std::tuple{"num_hidden_layers", a.num_hidden_layers, b.num_hidden_layers},
        std::tuple{"num_attention_heads", a.num_attention_heads, b.num_attention_heads},
        std::tuple{"num_key_value_heads", a.num_key_value_heads, b.num_key_value_heads},
        std::tuple{"head_dim", a.head_dim, b.head_dim}, std::tuple{"vocab_size", a.vocab_size, b.vocab_size}})
    differ(field, std::to_string(x), std::to_string(y));
  return out;
}

// A --base other than the adapter's base_model_name_or_path must be a model of the same
// architecture: LoRA's shapes alone do not tell a llama from a qwen3 of the same sizes.
void check_base_matches(const ExportJob& job, const std::string& recorded) {
  if (recorded.empty() || same_folder(job.base, recorded)) return;
  const fs::path recorded_config = fs::path(recorded) / "config.json";
  if (!fs::exists(recorded_config)) {
    std::printf("note: merging into %s, not the adapter's base_model_name_or_path %s (not here to compare with: only "
                "the adapter's shapes are checked)\n",
                job.base.c_str(), recorded.c_str());
    return;
  }
  const std::string differences = architecture_differences(
      load_model_config((fs::path(job.base) / "config.json").string()), load_model_config(recorded_config.string()));
  FAB_USER_CHECK(differences.empty(),
                 "{} {} is not the architecture the adapter {} was trained on ({}, its base_model_name_or_path): {}; "
                 "merged into it the adapter gives a broken model: pass the base it was trained on",
                 job.base_name, job.base, job.from, recorded, differences);
  std::printf("note: merging into %s, not the adapter's base_model_name_or_path %s (the same architecture)\n",
              job.base.c_str(), recorded.c_str());
}

// Everything an export reads is there and what it writes is free, before anything is written.
void check_export_job(ExportJob& job) {
  require_folder(job.from_name, job.from);
  if (is_adapter_folder(job.from)) {
    std::string recorded;
    read_adapter_config(job.from, &recorded);
    if (job.base.empty()) {
      FAB_USER_CHECK(!recorded.empty(), "{} {} is a LoRA adapter without base_model_name_or_path: pass --base", job.from_name,
                     job.from);
      FAB_USER_CHECK(fs::exists(recorded), "{} {} is a LoRA adapter of base_model_name_or_path {}, which is not here: "
                     "pass --base MODEL_DIR (the model it was trained on)", job.from_name, job.from, recorded);
      job.base = recorded;
      job.base_name = "the adapter's base_model_name_or_path";
    }
    require_model_folder(job.base_name, job.base);
    FAB_USER_CHECK(HfWeights::present(job.base), "{} {}: config.json but no weights (model.safetensors): an adapter "
                   "merges into the trained weights of its base", job.base_name, job.base);
    check_base_matches(job, recorded);
  } else {
    FAB_USER_CHECK(job.base.empty(), "{} {}: {} {} is a full model, not a LoRA adapter: there is nothing to merge "
                   "(leave --base out)", job.base_name, job.base, job.from_name, job.from);
    require_model_folder(job.from_name, job.from);
    FAB_USER_CHECK(HfWeights::present(job.from), "{} {}: no model.safetensors there (nothing to export)", job.from_name,
                   job.from);
  }
  if (!job.tokenizer_from.empty()) {
    require_folder("--tokenizer-from", job.tokenizer_from);
    FAB_USER_CHECK(has_tokenizer(job.tokenizer_from), "--tokenizer-from {}: no tokenizer.json or tokenizer.model there",
                   job.tokenizer_from);
  }
  for (const auto& [folder, name] : {std::pair{job.from, job.from_name}, std::pair{job.base, job.base_name},
                                     std::pair{job.tokenizer_from, std::string("--tokenizer-from")}})
    FAB_USER_CHECK(folder.empty() || !same_folder(job.to, folder),
                   "{} {} is the folder of {}: the export would replace what it reads; choose another {}", job.to_name,
                   job.to, name, job.to_name);
  FAB_USER_CHECK(job.overwrite || !holds_model(job.to), "{} {} already holds a model{}", job.to_name, job.to,
                 job.to_name == "--output" ? ": pass --overwrite to replace it" : "");
}

// The model_name_or_path of the run that saved a checkpoint (its train_config.yaml), or "".
std::string run_model_of(const std::string& checkpoint) {
  try {
    const YAML::Node y =
        load_yaml_file((fs::path(checkpoint) / "train_config.yaml").string(), "the train_config.yaml its run saved");
    return y["model_name_or_path"] && y["model_name_or_path"].IsScalar() ? y["model_name_or_path"].Scalar() : "";
  } catch (const UserError&) {
    return "";
  }
}

// Where the exported tokenizer comes from: --tokenizer-from; else the base (an adapter), the
// folder itself, or the model of the run that saved it (a Fabrica checkpoint holds no tokenizer);
// "" when none of them has one.
std::string tokenizer_source(const ExportJob& job) {
  if (!job.tokenizer_from.empty()) return job.tokenizer_from;
  for (const std::string& dir : {job.base, job.from})
    if (!dir.empty() && has_tokenizer(dir)) return dir;
  const std::string run_model = run_model_of(job.from);
  return !run_model.empty() && fs::is_directory(run_model) && has_tokenizer(run_model) ? run_model : "";
}

void export_tokenizer(const ExportJob& job) {
  const std::string source = tokenizer_source(job);
  if (source.empty()) {
    std::fflush(stdout);
    std::fprintf(stderr,
                 "warning: no tokenizer exported: %s has no tokenizer.json or tokenizer.model (nor the model of the run "
                 "that saved it), so `fabrica generate --model %s` cannot run; export again with --tokenizer-from "
                 "MODEL_DIR\n",
                 job.from.c_str(), job.to.c_str());
    return;
  }
  copy_tokenizer_and_template_files(source, job.to);
  if (source != job.tokenizer_from && source != job.base && source != job.from)
    std::printf("tokenizer: from %s, the model_name_or_path of the run that saved %s\n", source.c_str(),
                job.from.c_str());
}

}  // namespace

// A LoRA adapter folder merged into its base: W + scaling B A, saved as a full HF folder; a
// reward model's (stage rm) with its value head, into value_head.safetensors.
void export_merged(const std::string& base, const std::string& adapter, const std::string& to,
                   size_t shard_bytes = size_t(5) << 30) {
  std::unique_ptr<DecoderModel> model;
  if (holds_value_head(adapter)) {
    model = load_reward_model(adapter, "--checkpoint ", base);  // merged, value head and all
  } else {
    model = model_for_generation(base, adapter);
    merge_adapters(*model);
  }
  save_model_folder(*model, to, shard_bytes);
  std::printf("merged adapter %s into %s: exported to %s\n", adapter.c_str(), base.c_str(), to.c_str());
}

namespace {

// Checks, then writes under the output's run lock when it exists (a training run writing there
// refuses the export); the folders the export created are removed again when it fails.
void run_export_job(ExportJob job) {
  check_export_job(job);
  fs::path created = fs::absolute(job.to);  // the outermost folder this export creates ("" : none)
  if (fs::exists(created)) created.clear();
  while (!created.empty() && created.has_parent_path() && created != created.parent_path() &&
         !fs::exists(created.parent_path()))
    created = created.parent_path();
  std::optional<OutputDirLock> lock;  // a folder that is not there yet is no run's output_dir
  try {
    if (created.empty()) lock.emplace(job.to);
  } catch (const UserError& e) {
    throw UserError(format("{}: {}", job.to_name, e.what()));
  }
  try {
    if (is_adapter_folder(job.from)) {
      export_merged(job.base, job.from, job.to, job.shard_bytes);
    } else {
      DecoderOptions options;
      options.value_head = holds_value_head(job.from);  // a reward model keeps its value head
      auto model = load_model_folder(job.from, options);
      save_model_folder(*model, job.to, job.shard_bytes);
      std::printf("exported %s to %s\n", job.from.c_str(), job.to.c_str());
    }
    export_tokenizer(job);
  } catch (...) {
    std::error_code error;
    if (!created.empty()) fs::remove_all(created, error);
    throw;
  }
}

}  // namespace

// fabrica export --checkpoint DIR --output DIR: a checkpoint (or a LoRA adapter folder, merged
// into --base or its base_model_name_or_path) as an HF folder; or, as llamafactory-cli export, a
// YAML with model_name_or_path, adapter_name_or_path and export_dir.
int run_export(int argc, char** argv) {
  if (argc == 3 && std::string(argv[2]).find("--") != 0) {
    const std::string path = argv[2];
    const ExportYaml y = load_export_yaml(path);
    if (!y.ignored.empty()) {
      std::string keys;
      for (const std::string& k : y.ignored) keys += (keys.empty() ? "" : ", ") + k;
      std::printf("note: read without effect in fabrica export: %s\n", keys.c_str());
    }
    ExportJob job;
    const bool adapter = !y.adapter_name_or_path.empty();
    job.from = adapter ? y.adapter_name_or_path : y.model_name_or_path;
    job.from_name = path + ": " + (adapter ? "adapter_name_or_path" : "model_name_or_path");
    if (adapter) job.base = y.model_name_or_path, job.base_name = path + ": model_name_or_path";
    job.to = y.export_dir;
    job.to_name = path + ": export_dir";
    job.shard_bytes = size_t(y.export_size) * size_t(1000000000);  // transformers' "5GB"
    run_export_job(job);
    return 0;
  }
  Args args(argc, argv, 2, {"checkpoint", "output", "tokenizer-from", "base"}, {"overwrite"});
  FAB_USER_CHECK(args.has("checkpoint") && args.has("output"),
                 "usage: fabrica export --checkpoint DIR --output DIR [--base MODEL_DIR] [--tokenizer-from MODEL_DIR] "
                 "[--overwrite]   or   fabrica export EXPORT.yaml (model_name_or_path, adapter_name_or_path, export_dir)");
  ExportJob job;
  job.from = args.get("checkpoint"), job.from_name = "--checkpoint";
  job.base = args.get("base"), job.base_name = "--base";
  job.tokenizer_from = args.get("tokenizer-from");
  job.to = args.get("output"), job.to_name = "--output";
  job.overwrite = args.flag("overwrite");
  run_export_job(job);
  return 0;
}

}  // namespace fab
