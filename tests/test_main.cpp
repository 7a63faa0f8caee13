// fabrica_tests' main: GoogleTest's, plus one selection GoogleTest has no flag for.
// FAB_TEST_FOLDERS=kernels,nn,... runs only the tests defined in those folders of tests/ (ctest
// cpu_avx2_path: CMakeLists.txt's FAB_AVX2_TEST_FOLDERS), so a new test joins that run by the folder
// it lives in rather than by a name someone remembers to add to a filter.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

namespace {

std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> parts;
  std::stringstream in(text);
  for (std::string part; std::getline(in, part, ',');)
    if (!part.empty()) parts.push_back(part);
  return parts;
}

// Whether `file` (as the compiler saw it: "../tests/kernels/ops_test.cpp" or an absolute path)
// lies in tests/FOLDER/ for one of `folders`.
bool in_folders(const std::string& file, const std::vector<std::string>& folders) {
  for (const std::string& folder : folders)
    if (file.find("tests/" + folder + "/") != std::string::npos) return true;
  return false;
}

// The filter naming every test defined in `folders`; false (after saying why) where there is none
// or a --gtest_filter was given too.
bool select_folders(const std::string& list) {
  const std::vector<std::string> folders = split_commas(list);
  if (GTEST_FLAG_GET(filter) != "*") {
    std::fprintf(stderr, "FAB_TEST_FOLDERS and --gtest_filter do not combine: give one\n");
    return false;
  }
  std::string filter;
  const testing::UnitTest& all = *testing::UnitTest::GetInstance();
  for (int s = 0; s < all.total_test_suite_count(); ++s) {
    const testing::TestSuite& suite = *all.GetTestSuite(s);
    for (int t = 0; t < suite.total_test_count(); ++t) {
      const testing::TestInfo& test = *suite.GetTestInfo(t);
      if (!in_folders(test.file(), folders)) continue;
      filter += (filter.empty() ? "" : ":") + std::string(suite.name()) + "." + test.name();
    }
  }
  if (filter.empty()) {
    std::fprintf(stderr, "FAB_TEST_FOLDERS=%s: no test is defined in those folders of tests/\n", list.c_str());
    return false;
  }
  GTEST_FLAG_SET(filter, filter);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  if (const char* folders = std::getenv("FAB_TEST_FOLDERS"); folders && *folders && !select_folders(folders)) return 1;
  return RUN_ALL_TESTS();
}
