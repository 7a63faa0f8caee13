// libFuzzer target for the LLaMA-Factory dataset readers (`make fuzz`): the input, written to a
// .json or .jsonl file, is loaded as alpaca or sharegpt data (chosen by the first byte).
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <string>

#include "core/error.h"
#include "dataset/dataset.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const bool jsonl = data[0] & 1, sharegpt = data[0] & 2;
  const std::string path = "/tmp/fabrica-fuzz-" + std::to_string(::getpid()) + (jsonl ? ".jsonl" : ".json");
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(data) + 1, std::streamsize(size - 1));
  fab::DatasetAttr attr;
  attr.name = "fuzz";
  attr.file_name = path;
  attr.formatting = sharegpt ? "sharegpt" : "alpaca";
  attr.ranking = data[0] & 4;
  try {
    fab::DatasetOptions options;
    options.stage = attr.ranking ? fab::DataStage::rm : fab::DataStage::sft;
    fab::load_single_dataset(attr, options);
  } catch (const fab::UserError&) {
  }
  return 0;
}
