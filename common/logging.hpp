// Minimal leveled logging to stderr, thread-safe per line. GPUBOX_LOG(INFO) << "...";
#pragma once

#include <sstream>

namespace gpubox {

enum class LogLevel { DEBUG = 0, INFO = 1, WARNING = 2, ERROR = 3 };

// Lines below this level are dropped. Default INFO; GPUBOX_LOG_LEVEL=debug|info|warning|error.
LogLevel log_level();
void set_log_level(LogLevel level);

class LogLine {
 public:
  LogLine(LogLevel level, const char* file, int line);
  ~LogLine();
  template <class T>
  LogLine& operator<<(const T& value) {
    if (enabled_) out_ << value;
    return *this;
  }

 private:
  bool enabled_;
  LogLevel level_;
  std::ostringstream out_;
};

}  // namespace gpubox

#define GPUBOX_LOG(level) ::gpubox::LogLine(::gpubox::LogLevel::level, __FILE__, __LINE__)
