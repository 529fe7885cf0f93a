#include "table/server/connection_limits.hpp"

#include <sys/resource.h>

#include <algorithm>

namespace gpubox::table::server {

OpenFilesLimit open_files_limit() {
  rlimit r{};
  OpenFilesLimit out;
  if (::getrlimit(RLIMIT_NOFILE, &r) == 0) {
    out.soft = out.soft_before = r.rlim_cur;
    out.hard = r.rlim_max;
  }
  return out;
}

OpenFilesLimit raise_open_files_limit() {
  OpenFilesLimit out = open_files_limit();
  if (out.soft < out.hard) {
    rlimit r{};
    r.rlim_cur = out.hard;
    r.rlim_max = out.hard;
    if (::setrlimit(RLIMIT_NOFILE, &r) == 0) out.soft = out.hard;
  }
  return out;
}

std::size_t default_max_connections(uint64_t soft_limit) {
  const uint64_t usable =
      soft_limit > 2 * kReservedFds ? soft_limit - kReservedFds : soft_limit / 2;
  return static_cast<std::size_t>(std::clamp<uint64_t>(usable, 1, 1024));
}

bool LogThrottle::allow(Clock::time_point now, uint64_t* suppressed) {
  MutexLock lock(mu_);
  if (started_ && now - last_ < interval_) {
    ++held_back_;
    return false;
  }
  started_ = true;
  last_ = now;
  *suppressed = held_back_;
  held_back_ = 0;
  return true;
}

}  // namespace gpubox::table::server
