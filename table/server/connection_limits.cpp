#include "table/server/connection_limits.hpp"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include "common/logging.hpp"

namespace gpubox::table::server {

int client_user_timeout_s(const TcpKeepalive& keepalive, double longest_call_s) {
  const double call = std::ceil(std::max(0.0, longest_call_s));
  return static_cast<int>(std::clamp(call, static_cast<double>(keepalive.user_timeout()),
                                     static_cast<double>(INT32_MAX / 1000)));
}

Status enable_tcp_keepalive(int fd, const TcpKeepalive& keepalive, std::string* degraded) {
  struct Option {
    int level;
    int name;
    int value;
    const char* spelled;
  };
  const Option options[] = {
      {SOL_SOCKET, SO_KEEPALIVE, 1, "SO_KEEPALIVE"},
      {IPPROTO_TCP, TCP_KEEPIDLE, keepalive.idle_s, "TCP_KEEPIDLE"},
      {IPPROTO_TCP, TCP_KEEPINTVL, keepalive.interval_s, "TCP_KEEPINTVL"},
      {IPPROTO_TCP, TCP_KEEPCNT, keepalive.probes, "TCP_KEEPCNT"},
      {IPPROTO_TCP, TCP_USER_TIMEOUT, 1000 * keepalive.user_timeout(), "TCP_USER_TIMEOUT"}};
  for (const Option& option : options) {
    if (::setsockopt(fd, option.level, option.name, &option.value, sizeof(option.value)) == 0) {
      continue;
    }
    const std::string refused = std::string("setsockopt ") + option.spelled + " " +
                                std::to_string(option.value) + " on fd " + std::to_string(fd) +
                                ": " + std::strerror(errno);
    if (option.name == SO_KEEPALIVE || degraded == nullptr) return Status::IOError(refused);
    *degraded += (degraded->empty() ? "" : "; ") + refused;
  }
  return Status::OK();
}

Status enable_client_keepalive(int fd, const TcpKeepalive& keepalive, const std::string& peer) {
  std::string degraded;
  GPUBOX_RETURN_IF_ERROR(enable_tcp_keepalive(fd, keepalive, &degraded));
  static std::atomic<bool> warned{false};
  if (!degraded.empty() && !warned.exchange(true)) {
    GPUBOX_LOG(WARNING) << "gpubox: TCP keepalive of the connection to " << peer
                        << " keeps the OS's times (" << degraded
                        << "); a vanished server may be found later (warned once)";
  }
  return Status::OK();
}

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
