// Inputs the fuzz targets found (make fuzz): each must end in a UserError, not an escaped
// exception or a crash.
#include <gtest/gtest.h>

#include <fstream>

#include "core/error.h"
#include "dataset/dataset.h"
#include "test_util.h"

namespace fab {
namespace {

void expect_user_error(const std::string& name, const std::string& content, const std::string& formatting) {
  const std::string path = test::scratch_path(name);
  std::ofstream(path) << content;
  DatasetAttr attr;
  attr.name = name;
  attr.file_name = path;
  attr.formatting = formatting;
  EXPECT_THROW(load_single_dataset(attr, DatasetOptions{}), UserError) << content;
}

TEST(DatasetFuzzRegressions, NumbersTooLargeForAnyTypeAreUserErrors) {
  expect_user_error("huge.jsonl", "33333314886589259e99225\n", "sharegpt");
  expect_user_error("huge.json", R"([{"instruction": 1e99999, "output": "x"}])", "alpaca");
}

}  // namespace
}  // namespace fab
