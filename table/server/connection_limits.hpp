// What bounds gpubox_server's connections: the process's open-file limit, the connection cap
// derived from it, TCP keepalive (how long a half-open one lives), and a log throttle so that a
// flood of refusals writes one line per interval.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>

#include "common/status.hpp"
#include "common/thread_annotations.hpp"

namespace gpubox::table::server {

struct OpenFilesLimit {
  uint64_t soft = 0;
  uint64_t hard = 0;
  uint64_t soft_before = 0;  // the soft limit before raise_open_files_limit()
};

// Raises the soft RLIMIT_NOFILE to the hard limit where the system allows it (a process-wide
// change: for the gpubox_server binary, not for a library embedding the server).
OpenFilesLimit raise_open_files_limit();
// The current limits.
OpenFilesLimit open_files_limit();

// File descriptors a server keeps free of connections: table files, RocksDB, saves, logs, and
// the reserve descriptor of the accept loop.
inline constexpr uint64_t kReservedFds = 64;
// The default --max_connections: min(1024, soft limit - kReservedFds), at least 1 (half the soft
// limit when it is tiny).
std::size_t default_max_connections(uint64_t soft_limit);

// TCP keepalive of an accepted connection: a peer that vanished without closing it (its host
// lost or cut off: the connection half-open, open to the server alone) is found after
// idle_s + interval_s * probes seconds of silence (2 minutes), well before --idle_timeout_s
// (300 s), and its session closed, releasing what the peer held (its ranged dense writes become
// abandoned). Probes go only while nothing sent is unacknowledged, as when the server waits for
// a request; while something sent is unacknowledged (the peer vanished before it arrived), and on
// Linux >= 5.1 while the peer's receive window stays closed (a live peer too busy to read, as a
// server in a long SAVE with big frames pipelined to it), TCP_USER_TIMEOUT ends the connection
// after user_timeout(); once set, Linux also ends a connection whose probes go unanswered only
// after user_timeout(), not after the probes. A client's connections (transport.hpp) probe alike,
// but their TCP_USER_TIMEOUT is their longest call's deadline when that is longer
// (client_user_timeout_s: 286 s for a ranged DENSE window of 64 MiB frames on two connections at
// the defaults), so it never ends a connection a call would still wait on: a trainer waiting on a
// server that vanished (a BARRIER) fails within the longer of the two, naming the server.
struct TcpKeepalive {
  int idle_s = 60;         // silence before the first probe
  int interval_s = 10;     // between unanswered probes
  int probes = 6;          // unanswered probes that end the connection
  int user_timeout_s = 0;  // TCP_USER_TIMEOUT; 0: silence_s()
  // How long a vanished peer's connection lives, by probes.
  int silence_s() const { return idle_s + interval_s * probes; }
  int user_timeout() const { return user_timeout_s > 0 ? user_timeout_s : silence_s(); }
};
// A client's TCP_USER_TIMEOUT in seconds: its user_timeout() at least, and `longest_call_s`, its
// longest call's deadline, at least (that call then ends by its own deadline, naming the
// server).
int client_user_timeout_s(const TcpKeepalive& keepalive, double longest_call_s);
// Turns keepalive on for TCP socket `fd` with `keepalive`'s times. An error (naming the option)
// only when SO_KEEPALIVE itself is refused (a socket that is not TCP); a refused time
// (TCP_KEEPIDLE, TCP_KEEPINTVL, TCP_KEEPCNT, TCP_USER_TIMEOUT: an older kernel) leaves the OS's
// and is named in *degraded (when given) for the caller to warn of.
Status enable_tcp_keepalive(int fd, const TcpKeepalive& keepalive = {},
                            std::string* degraded = nullptr);
// enable_tcp_keepalive for a client's connection to `peer`: a refused time is warned of once per
// process, and the OS's kept; only a refused SO_KEEPALIVE is an error.
Status enable_client_keepalive(int fd, const TcpKeepalive& keepalive, const std::string& peer);

// Lets one log line through per interval and counts the ones it held back. Thread-safe.
class LogThrottle {
 public:
  using Clock = std::chrono::steady_clock;
  explicit LogThrottle(Clock::duration interval) : interval_(interval) {}
  // True when a line may be written at `now`; then *suppressed holds how many were held back
  // since the last line that went through.
  bool allow(Clock::time_point now, uint64_t* suppressed);

 private:
  const Clock::duration interval_;
  Mutex mu_;
  bool started_ GPUBOX_GUARDED_BY(mu_) = false;
  Clock::time_point last_ GPUBOX_GUARDED_BY(mu_);
  uint64_t held_back_ GPUBOX_GUARDED_BY(mu_) = 0;
};

}  // namespace gpubox::table::server
