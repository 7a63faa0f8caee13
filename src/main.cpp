// fabrica: the command-line front. Maps errors to exit codes: 2 for bad input (UserError), 1 for
// a library's failure (LibraryError, printed as it is) and for internal errors.
#include <omp.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <string>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/demo.h"
#include "cli/tokenizer_train_command.h"
#include "comm/mpi_communicator.h"
#include "config/stage.h"
#include "config/train_config.h"
#include "core/allocator.h"
#include "core/backend.h"
#include "core/error.h"
#include "core/stop_signals.h"
#include "kernels/cpu/matmul_onednn.h"
#include "kernels/cpu/machine_peak.h"

namespace {

constexpr const char* kVersion = "0.1.0";

// The stages `train` accepts, from the Stage enum ("pt, sft, rm, dpo, kto, grpo, ppo").
std::string stage_list() {
  std::string list;
  for (int i = 0;; ++i) {
    const char* name = fab::stage_name(fab::Stage(i));
    if (!std::strcmp(name, "?")) return list;
    list += (list.empty() ? "" : ", ") + std::string(name);
  }
}

void print_usage() {
  std::cout << "usage: fabrica <command> [options]    (fabrica <command> --help: its options and an example)\n\n"
               "commands:\n"
               "  train CONFIG.yaml [key=value ...]   train with LLaMA-Factory's keys (docs/CONFIG.md); stages:\n"
               "           " << stage_list() << "\n"
               "  data prepare CONFIG.yaml            tokenize the datasets into the cache, print counts\n"
               "  generate --model DIR --prompt TEXT  generate text [--adapter DIR --template NAME --max-new-tokens N\n"
               "           --temperature T --top-p P --top-k K --seed S]; --prompts FILE --output FILE: a file of prompts\n"
               "  chat --model DIR --template NAME    interactive multi-turn chat with the chat template\n"
               "  export --checkpoint DIR --output DIR  write a checkpoint (or merge a LoRA adapter) as a Hugging Face\n"
               "           folder; export EXPORT.yaml takes llamafactory-cli export's keys\n"
               "  score --model DIR --dataset NAMES   a reward model's scores of a dataset's responses\n"
               "           [--dataset-dir DIR --template NAME --cutoff-len N --max-samples N]\n"
               "  tokenize --tokenizer PATH           one JSON array of ids per input line [--input FILE]\n"
               "           [--add-special-tokens]\n"
               "  tokenizer train --input FILE[,FILE...] --vocab-size N --output DIR\n"
               "           [--special-tokens A,B,...] [--min-frequency N]  train a byte-level BPE tokenizer\n"
               "  init --hosts H1,H2 --nproc-per-node N  write cluster.yaml for a multi-node run [--iface IF]\n"
               "  trace summary OUTPUT_DIR  per rank: compute, communication exposed and hidden, idle; the\n"
               "           straggler (of a run with trace: true) [--json]\n"
               "  plan RUN.yaml  predicted memory and step time of every tp x pp x dp x ZeRO x recompute x\n"
               "           micro-batch layout, the best first [--cluster FILE | --devices N --device NAME] [--top N]\n"
               "           [--json]; plan --calibrate measures this machine\n"
               "  env        version, CPU features, kernel ISA in use, CUDA availability\n"
               "  demo       addition task -> BPE tokenizer -> tiny Qwen3 trained from scratch, accuracy\n"
               "             before and after [--steps N] [--workdir DIR]; demo --rl: then GRPO (or --stage ppo)\n"
               "  config-reference  print the configuration reference (docs/CONFIG.md)\n"
               "  --version  print the version\n\n"
               "examples, from the source folder, with a model downloaded to models/Qwen3-0.6B (Fabrica downloads\n"
               "nothing: hf download Qwen/Qwen3-0.6B --local-dir models/Qwen3-0.6B) and LLaMA-Factory's data/ folder;\n"
               "examples/README.md has one YAML per stage and per parallel layout:\n"
               "  fabrica train examples/train_full/qwen3_full_sft.yaml\n"
               "  fabrica generate --model saves/qwen3-0.6b/full/sft --template qwen3_nothink --prompt 'Who are you?'\n"
               "  fabrica chat --model saves/qwen3-0.6b/full/sft --template qwen3_nothink\n"
               "  fabrica train examples/train_lora/qwen3_lora_dpo.yaml\n"
               "  fabrica train examples/train_full/qwen3_full_grpo.yaml\n"
               "  fabrica plan examples/parallel/qwen3_full_sft_auto.yaml\n"
               "  echo 'Hello world' | fabrica tokenize --tokenizer models/Qwen3-0.6B\n";
}

// `fabrica COMMAND --help`: what the command does, its options and an example.
int print_command_help(const std::string& command) {
  static const std::map<std::string, const char*> help = {
      {"train",
       "fabrica train CONFIG.yaml [key=value ...]\n  Trains with a LLaMA-Factory-style YAML (stages STAGES; keys in "
       "docs/CONFIG.md; one example per stage and layout in examples/).\n  key=value pairs override the "
       "file.\nexample:\n  fabrica train examples/train_lora/qwen3_lora_sft.yaml max_steps=100 output_dir=saves/try\n"},
      {"data",
       "fabrica data prepare CONFIG.yaml [key=value ...]\n  Tokenizes the config's datasets into the cache and prints "
       "samples, tokens, truncated, skipped.\nexample:\n  fabrica data prepare run.yaml cutoff_len=1024\n"},
      {"generate",
       "fabrica generate --model DIR --prompt TEXT [--adapter PEFT_DIR] [--template NAME] [--system TEXT] [--max-new-tokens N]\n"
       "                 [--temperature T] [--top-p P] [--top-k K] [--seed S]\n  Greedy unless --temperature > 0; "
       "stops at the tokenizer's eos.\nexample:\n  fabrica generate --model saves/qwen3-sft --template qwen3_nothink "
       "--prompt 'Who are you?'\n"},
      {"chat",
       "fabrica chat --model DIR --template NAME [--system TEXT] [sampling options as generate]\n  Interactive; "
       "/clear resets the conversation, an empty line quits.\nexample:\n  fabrica chat --model saves/qwen3-sft "
       "--template qwen3_nothink\n"},
      {"export",
       "fabrica export --checkpoint DIR --output DIR [--base MODEL_DIR] [--tokenizer-from MODEL_DIR] [--overwrite]\n"
       "fabrica export EXPORT.yaml   (llamafactory-cli's keys: model_name_or_path, adapter_name_or_path, export_dir)\n"
       "  Writes a checkpoint as a Hugging Face folder (config.json, model.safetensors, tokenizer files); a LoRA "
       "adapter folder is merged into its base (--base, else its base_model_name_or_path) first. An --output that "
       "already holds a model is replaced only with --overwrite (never an input folder, nor a running run's "
       "output_dir). The tokenizer comes from --tokenizer-from, else the base or the folder, else the "
       "model_name_or_path of the run that saved the checkpoint.\nexample:\n  fabrica export --checkpoint "
       "saves/run/checkpoint-500 --output saves/run-500 --tokenizer-from models/Qwen3-0.6B\n"},
      {"score",
       "fabrica score --model DIR --dataset NAMES [--dataset-dir DIR] [--template NAME] [--cutoff-len N]\n"
       "              [--max-samples N] [--batch-size N]\n  Scores each response with a reward model (stage rm's "
       "value head, value_head.safetensors) at its last token: one JSON line per example, {\"index\", "
       "\"chosen\", \"rejected\"} for a ranking dataset, {\"index\", \"score\"} otherwise, then a summary "
       "(accuracy: chosen scored above rejected).\nexample:\n  fabrica score --model saves/qwen3-reward --dataset "
       "dpo_en_demo --dataset-dir data --template qwen3_nothink\n"},
      {"tokenize",
       "fabrica tokenize --tokenizer PATH [--input FILE] [--add-special-tokens]\n  One JSON array of ids per input "
       "line (stdin without --input).\nexample:\n  echo 'Hello world' | fabrica tokenize --tokenizer "
       "../shared/data/tokenizers/qwen3\n"},
      {"tokenizer",
       "fabrica tokenizer train --input FILE[,FILE...] --vocab-size N --output DIR [--special-tokens A,B,...] "
       "[--min-frequency N]\n  Trains a byte-level BPE tokenizer and writes tokenizer.json.\nexample:\n  fabrica "
       "tokenizer train --input corpus.txt --vocab-size 8000 --output my-tokenizer\n"},
      {"trace",
       "fabrica trace summary OUTPUT_DIR [--json]\n  Sums up output_dir/trace/rank-N.json (written by a run with trace: "
       "true): per rank the traced steps' compute, communication the compute thread waited for, communication "
       "hidden behind compute, and idle time; the slowest rank and the longest wait. The traces load in "
       "ui.perfetto.dev and chrome://tracing.\nexample:\n  fabrica trace summary saves/run\n"},
      {"plan",
       "fabrica plan RUN.yaml [key=value ...] [--cluster FILE] [--top N] [--json]\n"
       "             [--devices N --devices-per-node M --device h100-80g|h200-141g|a100-80g|910b-64g]\n"
       "fabrica plan --calibrate [--nproc N] [--output cluster.yaml]\n"
       "  Enumerates the legal layouts of the run's model (config.json), cutoff_len, global batch and precision:\n"
       "  tp within a node dividing the heads, pp, virtual stages, dp, ep (mixture of experts), ZeRO stage, recompute,\n"
       "  micro-batch size;\n"
       "  predicts each one's peak memory per device and step time (docs/PLANNER.md) and prints the N fastest\n"
       "  that fit (default 5) with the memory breakdown of the best, and every pruned family with its reason.\n"
       "  Without a cluster it plans for this machine at the YAML's nproc_per_node. --json prints\n"
       "  {\"layouts\": [...], \"pruned\": [...]}. Exit code 3 when no layout fits. --calibrate measures this\n"
       "  machine (GEMM rate, all-reduce bandwidth and latency over N processes under mpirun, memory) and\n"
       "  prints (or writes) a cluster file.\nexample:\n  fabrica plan run.yaml --devices 512 --devices-per-node 8 "
       "--device h100-80g --top 3\n"},
      {"env", "fabrica env\n  Version, CPU features, the kernel ISA in use, the peak MFU is measured against, MPI and CUDA availability.\nexample:\n  fabrica env\n"},
      {"init",
       "fabrica init --hosts H1,H2 --nproc-per-node N [--iface IF] [--rsh-agent CMD] [--output cluster.yaml]\n"
       "  Writes a cluster file: the hosts, workers per host, the network interface (a name or a CIDR) and how\n"
       "  mpirun reaches the other hosts (ssh by default). `fabrica train CONFIG.yaml cluster=cluster.yaml` then\n"
       "  starts every worker through mpirun.\nexample:\n  fabrica init --hosts node1,node2 --nproc-per-node 8 "
       "--iface eth0\n"},
      {"demo",
       "fabrica demo [--steps N] [--workdir DIR]\n  Synthetic addition task, BPE tokenizer, tiny Qwen3 trained from "
       "scratch; accuracy before and after.\nfabrica demo --rl [--steps N] [--rl-steps M] [--workdir DIR] [--stage "
       "grpo|ppo]\n  The same task: N steps of SFT (part of the way), then M steps of GRPO (or PPO with a critic) "
       "with the exact-match reward; accuracy before and after.\nexample:\n  fabrica demo --steps 500\n"},
  };
  auto it = help.find(command);
  if (it == help.end()) {
    print_usage();
    return 2;
  }
  std::string text = it->second;
  if (const size_t at = text.find("STAGES"); at != std::string::npos) text.replace(at, 6, stage_list());
  std::cout << "usage: " << text;
  return 0;
}

int run_env() {
  __builtin_cpu_init();
  std::cout << "fabrica " << kVersion << "\n";
  std::cout << "cpu kernels: " << fab::backend(fab::DeviceKind::cpu).name() << "\n";
  std::cout << "cpu features:";
  if (__builtin_cpu_supports("avx2")) std::cout << " avx2";
  if (__builtin_cpu_supports("fma")) std::cout << " fma";
  if (__builtin_cpu_supports("avx512f")) std::cout << " avx512f";
  if (__builtin_cpu_supports("avx512bw")) std::cout << " avx512bw";
  if (__builtin_cpu_supports("avx512vl")) std::cout << " avx512vl";
  if (__builtin_cpu_supports("avx512bf16")) std::cout << " avx512bf16";
  std::cout << "\nopenmp threads: " << omp_get_max_threads() << "\n";
  std::cout << "gemm: " << fab::cpu::onednn_description() << "\n";
  std::cout << "bf16 gemm: " << fab::cpu::bf16_gemm_path().why << "\n";
  const fab::MachinePeak peak = fab::machine_peak(omp_get_max_threads());
  std::printf("peak (MFU's denominator): %.1f GFLOP/s fp32, %.1f GFLOP/s bf16 on %d threads (%s); %s\n",
              peak.fp32_gflops, peak.bf16_gflops, peak.threads, peak.bf16_basis.c_str(), peak.source.c_str());
  std::cout << "mpi: " << fab::mpi_library_version() << "\n";
  const fab::Backend& cuda = fab::backend(fab::DeviceKind::cuda);
  std::cout << "cuda: " << (cuda.available() ? "available, " : "") << cuda.name() << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    fab::fix_system_mmap_threshold();  // before anything allocates (core/allocator.h says why)
    fab::start_signal_watcher();  // before any other thread exists (core/stop_signals.h)
    if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
      print_usage();
      return argc < 2 ? 2 : 0;
    }
    const std::string command = argv[1];
    for (int i = 2; i < argc; ++i)
      if (!std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h")) return print_command_help(command);
    if (command == "--version") {
      std::cout << "fabrica " << kVersion << "\n";
      return 0;
    }
    if (command == "env") return run_env();
    if (command == "train") return fab::run_train(argc, argv);
    if (command == "data" && argc >= 3 && !std::strcmp(argv[2], "prepare")) return fab::run_data_prepare(argc, argv);
    if (command == "tokenize") return fab::run_tokenize(argc, argv);
    if (command == "tokenizer" && argc >= 3 && !std::strcmp(argv[2], "train")) return fab::run_tokenizer_train(argc, argv);
    if (command == "generate") return fab::run_generate(argc, argv);
    if (command == "chat") return fab::run_chat(argc, argv);
    if (command == "export") return fab::run_export(argc, argv);
    if (command == "score") return fab::run_score(argc, argv);
    if (command == "init") return fab::run_init(argc, argv);
    if (command == "plan") return fab::run_plan(argc, argv);
    if (command == "trace" && argc >= 3 && !std::strcmp(argv[2], "summary")) return fab::run_trace_summary(argc, argv);
    if (command == "config-reference") {
      std::cout << fab::config_reference_markdown();
      return 0;
    }
    if (command == "demo") {
      fab::Args args(argc, argv, 2, {"steps", "workdir", "rl-steps", "stage"}, {"rl"});
      const bool rl = args.flag("rl");
      const int steps = int(args.get_number("steps", rl ? 450 : 1000));
      FAB_USER_CHECK(steps > 0, "--steps must be positive");
      if (rl)
        return fab::run_demo_rl(steps, int(args.get_integer("rl-steps", 40, 1, 1 << 20)),
                                args.get("workdir", "build/demo-rl"), args.get("stage", "grpo"));
      return fab::run_demo(steps, args.get("workdir", "build/demo"));
    }
    std::cerr << "fabrica: unknown command \"" << command << "\" (try fabrica --help)\n";
    return 2;
  } catch (const fab::UserError& e) {
    std::cerr << "fabrica: " << e.what() << "\n";
    return 2;
  } catch (const std::filesystem::filesystem_error& e) {  // a path the user gave
    std::cerr << "fabrica: " << e.what() << "\n";
    return 2;
  } catch (const fab::LibraryError& e) {
    std::cerr << "fabrica: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "fabrica: internal error: " << e.what() << "\n";
    return 1;
  }
}
