#pragma once
// Checks of the folders a command is given (--model, --checkpoint, --base, --tokenizer-from), so
// that a wrong one is refused naming the flag and what the folder is, before any work.
#include <string>

#include "image/qwen2_vl_processor.h"
#include "models/model_config.h"

namespace fab {

// `dir`, given as `what` (e.g. "--model"), exists and is a folder.
void require_folder(const std::string& what, const std::string& dir);

// `dir` is a Hugging Face model folder: a folder with config.json. A PEFT adapter folder is
// refused saying how to use it (--model BASE --adapter DIR).
void require_model_folder(const std::string& what, const std::string& dir);

// The adapter folder's base_model_name_or_path ("" when it has none or its config cannot be read).
std::string adapter_base_model(const std::string& adapter_dir);

// The folder holds a tokenizer (tokenizer.json or tokenizer.model).
bool has_tokenizer(const std::string& dir);

// A vision-language model folder's preprocessor_config.json: its patches must be the tower's (the
// same patch sizes and merge, 3 channels), else a UserError naming both.
Qwen2VLImageConfig image_processor_of(const std::string& model_dir, const VisionConfig& tower);

}  // namespace fab
