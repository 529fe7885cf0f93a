// An allocation of card, simulated-card or pinned memory that failed, saying what was asked. It
// is a std::bad_alloc, so that the binaries answer it as any allocation that fails: naming what
// the config asked for, largest first (common/config/memory_asks.hpp), not a bare error.
#pragma once

#include <new>
#include <string>
#include <utility>

namespace gpubox {

class OutOfMemory : public std::bad_alloc {
 public:
  explicit OutOfMemory(std::string message) : message_(std::move(message)) {}
  const char* what() const noexcept override { return message_.c_str(); }

 private:
  std::string message_;
};

}  // namespace gpubox
