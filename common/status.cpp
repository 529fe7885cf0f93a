#include "common/status.hpp"

#include <sstream>

namespace gpubox {
namespace detail {
void throw_error(const char* file, int line, const std::string& message) {
  const char* base = file;
  for (const char* p = file; *p; ++p) {
    if (*p == '/') base = p + 1;
  }
  std::ostringstream out;
  out << message << " [" << base << ":" << line << "]";
  throw Error(out.str());
}
}  // namespace detail

const char* Status::code_name(Code code) {
  switch (code) {
    case Code::kOk: return "OK";
    case Code::kInvalidArgument: return "InvalidArgument";
    case Code::kNotFound: return "NotFound";
    case Code::kIOError: return "IOError";
    case Code::kCorruption: return "Corruption";
    case Code::kUnavailable: return "Unavailable";
    case Code::kDeadlineExceeded: return "DeadlineExceeded";
    case Code::kPermissionDenied: return "PermissionDenied";
    case Code::kResourceExhausted: return "ResourceExhausted";
    case Code::kAborted: return "Aborted";
    case Code::kInternal: return "Internal";
  }
  return "Unknown";
}

std::string Status::to_string() const {
  if (ok()) return "OK";
  return std::string(code_name(code_)) + ": " + message_;
}

Status Status::with_context(const std::string& context) const {
  if (ok()) return *this;
  return Status(code_, context + ": " + message_);
}

void throw_if_error(const Status& status) {
  if (!status.ok()) throw Error(status.to_string());
}

}  // namespace gpubox
