// One error vocabulary for the project (STYLE.md): GPUBOX_EXPECTS for preconditions,
// GPUBOX_FAIL for unreachable or unrecoverable states, GPUBOX_CUDA_TRY (heterps/device) for
// CUDA/NCCL/cuBLAS statuses. All throw gpubox::Error, which carries file:line. Exceptions never
// cross a socket or a file format: those boundaries return Status (common/status.hpp).
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace gpubox {

// what() is the whole text, for logs and tests: the message, then where it was raised (the
// expectation that failed, file:line). A program shows its user message() alone and logs
// where() (an assertion expression is no help to a user; the location is to a developer).
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message), message_(message) {}
  Error(const std::string& message, const std::string& where)
      : std::runtime_error(message + " " + where), message_(message), where_(where) {}
  const std::string& message() const { return message_; }
  const std::string& where() const { return where_; }

 private:
  std::string message_;
  std::string where_;  // "" when none was given
};

// An error that only tells of a failure found elsewhere (another training thread's, stopping
// this one; another trainer's step that failed on a server restart, heard at a sync barrier):
// what failed is named where it happened, so beside a server restart it is left out
// (trainer/schedule/restart_beside.hpp). Error's constructors: a location (`where`) is kept
// when one is given.
class FailureTold : public Error {
 public:
  using Error::Error;
};

namespace detail {
[[noreturn]] void throw_error(const char* file, int line, const std::string& message,
                              const char* expectation = nullptr);

// Builds a message from stream-able parts: GPUBOX_FAIL("key ", key, " missing on card ", c).
template <class... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}
}  // namespace detail
}  // namespace gpubox

#define GPUBOX_FAIL(...) \
  ::gpubox::detail::throw_error(__FILE__, __LINE__, ::gpubox::detail::concat(__VA_ARGS__))

#define GPUBOX_EXPECTS(cond, ...)                                                              \
  do {                                                                                         \
    if (!(cond)) {                                                                             \
      ::gpubox::detail::throw_error(__FILE__, __LINE__, ::gpubox::detail::concat(__VA_ARGS__), \
                                    #cond);                                                    \
    }                                                                                          \
  } while (0)
