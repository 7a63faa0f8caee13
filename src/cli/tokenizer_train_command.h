#pragma once
// fabrica tokenizer train --input FILES --vocab-size N --output DIR
//                         [--special-tokens LIST] [--min-frequency N]
// Trains a byte-level BPE tokenizer (tokenizer/bpe_trainer.h) and writes tokenizer.json and
// tokenizer_config.json into DIR.

namespace fab {
// argv as given to `fabrica`: argv[1] == "tokenizer", argv[2] == "train".
int run_tokenizer_train(int argc, char** argv);
}  // namespace fab
