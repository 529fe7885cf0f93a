#include "common/status.hpp"

#include "common/enum_names.hpp"
#include "common/group_aborted.hpp"

namespace gpubox {
namespace detail {
namespace {
// "[file.cpp:42]", the file without its folders.
std::string location(const char* file, int line) {
  const char* base = file;
  for (const char* p = file; *p; ++p) {
    if (*p == '/') base = p + 1;
  }
  return "[" + std::string(base) + ":" + std::to_string(line) + "]";
}
}  // namespace

void throw_error(const char* file, int line, const std::string& message, const char* expectation) {
  std::string where = location(file, line);
  if (expectation != nullptr) where = "(expected: " + std::string(expectation) + ") " + where;
  throw Error(message, where);
}

void throw_group_aborted(const char* file, int line, const std::string& message,
                         const std::string& reason) {
  throw GroupAborted(message, location(file, line), reason);
}
}  // namespace detail

namespace {
using Code = Status::Code;
constexpr EnumName<Code> kCodeNames[] = {{Code::kOk, "OK"},
                                         {Code::kInvalidArgument, "InvalidArgument"},
                                         {Code::kNotFound, "NotFound"},
                                         {Code::kIOError, "IOError"},
                                         {Code::kCorruption, "Corruption"},
                                         {Code::kUnavailable, "Unavailable"},
                                         {Code::kDeadlineExceeded, "DeadlineExceeded"},
                                         {Code::kPermissionDenied, "PermissionDenied"},
                                         {Code::kResourceExhausted, "ResourceExhausted"},
                                         {Code::kAborted, "Aborted"},
                                         {Code::kInternal, "Internal"}};
}  // namespace

const char* Status::code_name(Code code) { return name_of(kCodeNames, code); }

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
