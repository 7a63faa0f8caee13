#pragma once
// Errors that say where and why: FAB_CHECK(cond, "expected {} got {}", a, b) throws fab::Error
// carrying file:line. The CLI maps UserError to exit code 2 and other errors to 1.
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>

namespace fab {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Bad input from the user (a config value, a file): never an internal bug.
class UserError : public Error {
 public:
  using Error::Error;
};

// A third-party library (oneDNN, MPI, ...) failed on work a run asked of it: the message says what
// was being done, the library's own words, and what to try. Not a Fabrica bug report.
class LibraryError : public Error {
 public:
  using Error::Error;
};

namespace detail {
inline void format_into(std::ostringstream& out, std::string_view fmt) { out << fmt; }

template <typename T, typename... Rest>
void format_into(std::ostringstream& out, std::string_view fmt, const T& value, const Rest&... rest) {
  size_t pos = fmt.find("{}");
  if (pos == std::string_view::npos) {
    out << fmt;
    return;
  }
  out << fmt.substr(0, pos) << value;
  format_into(out, fmt.substr(pos + 2), rest...);
}
}  // namespace detail

// "{}" placeholders filled in order, like fmt::format without the dependency.
template <typename... Args>
std::string format(std::string_view fmt, const Args&... args) {
  std::ostringstream out;
  detail::format_into(out, fmt, args...);
  return out.str();
}

}  // namespace fab

#define FAB_CHECK(cond, ...)                                                                  \
  do {                                                                                        \
    if (!(cond))                                                                              \
      throw ::fab::Error(::fab::format("{}:{}: ", __FILE__, __LINE__) + ::fab::format(__VA_ARGS__)); \
  } while (0)

#define FAB_USER_CHECK(cond, ...)                     \
  do {                                                \
    if (!(cond)) throw ::fab::UserError(::fab::format(__VA_ARGS__)); \
  } while (0)
