// fabrica tokenize / generate / export.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "cli/args.h"
#include "cli/commands.h"
#include "core/error.h"
#include "data/template.h"
#include "data/tokenizer.h"
#include "data/tokenizer_encoder.h"
#include "infer/generate.h"
#include "models/hf_model.h"
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

// A user turn rendered by the chat template, as the model saw prompts in training.
std::vector<int32_t> templated_prompt(const Tokenizer& tokenizer, const std::string& template_name,
                                      const std::string& prompt, const std::string& system) {
  TokenizerEncoder encoder(tokenizer);
  TemplateOptions options;
  options.enable_thinking = false;
  ChatTemplate chat(get_template(template_name), encoder, options);
  auto turns = chat.encode_oneturn({{Role::user, prompt}, {Role::assistant, ""}}, system, "");
  return turns.first;
}

}  // namespace

int run_generate(int argc, char** argv) {
  Args args(argc, argv, 2,
            {"model", "prompt", "template", "system", "max-new-tokens", "temperature", "top-p", "top-k", "seed"}, {});
  FAB_USER_CHECK(args.has("model") && args.has("prompt"),
                 "usage: fabrica generate --model DIR --prompt TEXT [--template NAME] [--max-new-tokens N] "
                 "[--temperature T --top-p P --top-k K --seed S]");
  const std::string dir = args.get("model");
  const Tokenizer tokenizer = Tokenizer::load(dir);
  SamplingOptions o;
  o.max_new_tokens = int64_t(args.get_number("max-new-tokens", 128));
  o.temperature = args.get_number("temperature", 0.0);
  o.top_p = args.get_number("top-p", 1.0);
  o.top_k = int64_t(args.get_number("top-k", 0));
  o.seed = uint64_t(args.get_number("seed", 0));
  if (tokenizer.eos_id()) o.stop_ids.push_back(*tokenizer.eos_id());
  const std::vector<int32_t> prompt =
      args.has("template") ? templated_prompt(tokenizer, args.get("template"), args.get("prompt"), args.get("system"))
                           : tokenizer.encode(args.get("prompt"), true);
  const ModelConfig config = load_model_config((fs::path(dir) / "config.json").string());
  auto model = load_model_folder(dir, {Precision::fp32, false, std::min<int64_t>(
                                                                    config.max_position_embeddings,
                                                                    int64_t(prompt.size()) + o.max_new_tokens)});
  FAB_USER_CHECK(HfWeights::present(dir), "{}: no weights to generate with (config.json only)", dir);
  std::vector<int32_t> generated;
  std::string printed;
  generate(*model, prompt, o, [&](int32_t token) {
    generated.push_back(token);
    const std::string text = tokenizer.decode(generated, true);  // print only the new, complete text
    if (text.size() > printed.size() && text.compare(0, printed.size(), printed) == 0) {
      std::fputs(text.c_str() + printed.size(), stdout);
      std::fflush(stdout);
      printed = text;
    }
  });
  std::puts("");
  return 0;
}

int run_export(int argc, char** argv) {
  Args args(argc, argv, 2, {"checkpoint", "output", "tokenizer-from"}, {});
  FAB_USER_CHECK(args.has("checkpoint") && args.has("output"),
                 "usage: fabrica export --checkpoint DIR --output DIR [--tokenizer-from MODEL_DIR]");
  const std::string from = args.get("checkpoint"), to = args.get("output");
  auto model = load_model_folder(from, {});
  save_model_folder(*model, to);
  const std::string tokenizer_dir = args.get("tokenizer-from", from);
  for (const char* name : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model"}) {
    const fs::path src = fs::path(tokenizer_dir) / name;
    if (fs::exists(src)) fs::copy_file(src, fs::path(to) / name, fs::copy_options::overwrite_existing);
  }
  std::printf("exported %s to %s\n", from.c_str(), to.c_str());
  return 0;
}

}  // namespace fab
