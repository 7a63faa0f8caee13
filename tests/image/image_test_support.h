#pragma once
// Shared by the image tests: the fixture folder, files as bytes, and a check that a call fails
// with a UserError whose message holds some words.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "core/error.h"

namespace fab::test {

// Written by tests/reference/make_image_reference.py.
inline std::filesystem::path image_fixture_dir() { return std::filesystem::path(FAB_SOURCE_DIR) / "tests/reference/image"; }

inline std::vector<uint8_t> file_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

template <typename F>
std::string user_error_of(F&& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no UserError";
  return "";
}

}  // namespace fab::test
