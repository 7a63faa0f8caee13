#pragma once
// The fabrica subcommands; each returns the process exit code and throws UserError on bad input.

namespace fab {
int run_train(int argc, char** argv);         // fabrica train CONFIG.yaml [key=value ...]
int run_data_prepare(int argc, char** argv);  // fabrica data prepare CONFIG.yaml [key=value ...]
int run_tokenize(int argc, char** argv);      // fabrica tokenize --tokenizer PATH [--input FILE]
int run_generate(int argc, char** argv);      // fabrica generate --model DIR --prompt TEXT ...
int run_export(int argc, char** argv);        // fabrica export --checkpoint DIR --output DIR
int run_chat(int argc, char** argv);          // fabrica chat --model DIR --template NAME
int run_init(int argc, char** argv);          // fabrica init --hosts h1,h2 --nproc-per-node N
int run_score(int argc, char** argv);         // fabrica score --model DIR --dataset NAMES
int run_trace_summary(int argc, char** argv);  // fabrica trace summary OUTPUT_DIR [--json]
int run_plan(int argc, char** argv);           // fabrica plan RUN.yaml [--cluster FILE] [--top N] [--json]
}  // namespace fab
