// One error vocabulary for the project (STYLE.md): GPUBOX_EXPECTS for preconditions,
// GPUBOX_FAIL for unreachable or unrecoverable states, GPUBOX_CUDA_TRY (heterps/device) for
// CUDA/NCCL/cuBLAS statuses. All throw gpubox::Error, which carries file:line. Exceptions never
// cross a socket or a file format: those boundaries return Status (common/status.hpp).
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace gpubox {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
[[noreturn]] void throw_error(const char* file, int line, const std::string& message);

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

#define GPUBOX_EXPECTS(cond, ...)                                                               \
  do {                                                                                          \
    if (!(cond)) {                                                                              \
      ::gpubox::detail::throw_error(                                                            \
          __FILE__, __LINE__, ::gpubox::detail::concat(__VA_ARGS__, " (expected: " #cond ")")); \
    }                                                                                           \
  } while (0)
