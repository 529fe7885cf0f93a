// Status / StatusOr<T> for I/O and network boundaries (LevelDB-style). A Status is cheap when OK.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "common/error.hpp"

namespace gpubox {

class Status {
 public:
  enum class Code {
    kOk = 0,
    kInvalidArgument,
    kNotFound,
    kIOError,
    kCorruption,
    kUnavailable,
    kDeadlineExceeded,
    kPermissionDenied,
    kResourceExhausted,
    kAborted,
    kInternal
  };

  Status() = default;
  static Status OK() { return Status(); }
  static Status InvalidArgument(std::string msg) {
    return {Code::kInvalidArgument, std::move(msg)};
  }
  static Status NotFound(std::string msg) { return {Code::kNotFound, std::move(msg)}; }
  static Status IOError(std::string msg) { return {Code::kIOError, std::move(msg)}; }
  static Status Corruption(std::string msg) { return {Code::kCorruption, std::move(msg)}; }
  static Status Unavailable(std::string msg) { return {Code::kUnavailable, std::move(msg)}; }
  static Status DeadlineExceeded(std::string msg) {
    return {Code::kDeadlineExceeded, std::move(msg)};
  }
  static Status PermissionDenied(std::string msg) {
    return {Code::kPermissionDenied, std::move(msg)};
  }
  static Status ResourceExhausted(std::string msg) {
    return {Code::kResourceExhausted, std::move(msg)};
  }
  static Status Aborted(std::string msg) { return {Code::kAborted, std::move(msg)}; }
  static Status Internal(std::string msg) { return {Code::kInternal, std::move(msg)}; }

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }
  // "IOError: part-3: short read" or "OK".
  std::string to_string() const;
  static const char* code_name(Code code);

  // Prepends context: st.with_context("loading model/") -> "IOError: loading model/: ...".
  Status with_context(const std::string& context) const;

 private:
  Status(Code code, std::string message) : code_(code), message_(std::move(message)) {}
  Code code_ = Code::kOk;
  std::string message_;
};

// Holds a value or a non-OK Status.
template <class T>
class StatusOr {
 public:
  StatusOr(Status status) : status_(std::move(status)) {  // NOLINT: implicit by design
    GPUBOX_EXPECTS(!status_.ok(), "StatusOr built from an OK status without a value");
  }
  StatusOr(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  T& value() & {
    check();
    return *value_;
  }
  const T& value() const& {
    check();
    return *value_;
  }
  T&& value() && {
    check();
    return std::move(*value_);
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }

 private:
  void check() const {
    if (!status_.ok()) throw Error(status_.to_string());
  }
  Status status_;
  std::optional<T> value_;
};

// Throws gpubox::Error when the status is not OK (for callers above the I/O boundary).
void throw_if_error(const Status& status);

}  // namespace gpubox

#define GPUBOX_RETURN_IF_ERROR(expr) \
  do {                               \
    ::gpubox::Status _st = (expr);   \
    if (!_st.ok()) return _st;       \
  } while (0)
