#include "common/logging.hpp"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

#include "common/enum_names.hpp"
#include "common/log_sink.hpp"
#include "common/thread_annotations.hpp"

namespace gpubox {
namespace {
constexpr EnumName<LogLevel> kLogLevelNames[] = {{LogLevel::DEBUG, "debug"},
                                                 {LogLevel::INFO, "info"},
                                                 {LogLevel::WARNING, "warning"},
                                                 {LogLevel::ERROR, "error"}};

// GPUBOX_LOG_LEVEL; unset or not a level name: INFO.
LogLevel level_from_env() {
  const char* env = std::getenv("GPUBOX_LOG_LEVEL");
  if (env == nullptr) return LogLevel::INFO;
  const StatusOr<LogLevel> level = parse_enum(kLogLevelNames, env);
  return level.ok() ? level.value() : LogLevel::INFO;
}
std::atomic<int> g_level{static_cast<int>(level_from_env())};
// Serializes writes to stderr, so lines of concurrent threads never interleave.
Mutex g_write_mu;
LogSink g_sink GPUBOX_GUARDED_BY(g_write_mu);  // empty: stderr
}  // namespace

LogLevel log_level() { return static_cast<LogLevel>(g_level.load(std::memory_order_relaxed)); }
void set_log_level(LogLevel level) { g_level.store(static_cast<int>(level)); }
void set_log_sink(LogSink sink) {
  MutexLock lock(g_write_mu);
  g_sink = std::move(sink);
}

LogLine::LogLine(LogLevel level, const char* file, int line)
    : enabled_(static_cast<int>(level) >= g_level.load(std::memory_order_relaxed)), level_(level) {
  if (!enabled_) return;
  static const char kTag[] = {'D', 'I', 'W', 'E'};
  const char* base = std::strrchr(file, '/');
  std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm_now{};
  localtime_r(&now, &tm_now);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%m%d %H:%M:%S", &tm_now);
  out_ << kTag[static_cast<int>(level)] << stamp << ' ' << (base ? base + 1 : file) << ':' << line
       << "] ";
}

LogLine::~LogLine() {
  if (!enabled_) return;
  MutexLock lock(g_write_mu);
  if (g_sink) {
    g_sink(level_, out_.str());
    return;
  }
  out_ << '\n';
  const std::string text = out_.str();
  std::fwrite(text.data(), 1, text.size(), stderr);
}

}  // namespace gpubox
