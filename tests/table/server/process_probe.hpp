// What the server tests and gpubox_fault_probe observe from outside a server: a process's
// resident memory, CPU time and open descriptors (Linux /proc), and whether a peer closed a
// socket. No test framework here: gpubox_fault_probe is a plain tool.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>

namespace gpubox::table::server::testing {

// A blocking TCP socket connected to 127.0.0.1:`port` from the local address `source` (any of
// 127.0.0.0/8 reaches it, and in a namespace of a test's own the addresses it put on its loopback,
// own_network.hpp): the server sees another peer address (of the loopback host, or of another
// host). -1 (errno set) when it fails.
inline int loopback_socket_from(const char* source, uint16_t port) {
  sockaddr_in from{}, to{};
  from.sin_family = to.sin_family = AF_INET;
  to.sin_port = htons(port);
  if (::inet_pton(AF_INET, source, &from.sin_addr) != 1 ||
      ::inet_pton(AF_INET, "127.0.0.1", &to.sin_addr) != 1) {
    errno = EINVAL;
    return -1;
  }
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof(from)) != 0 ||
      ::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) != 0) {
    const int err = errno;
    ::close(fd);
    errno = err;
    return -1;
  }
  return fd;
}

// Resident set size of process `pid` (0: this process) in bytes.
inline std::size_t resident_bytes(pid_t pid = 0) {
  std::ifstream status(pid == 0 ? std::string("/proc/self/status")
                                : "/proc/" + std::to_string(pid) + "/status");
  std::string word;
  while (status >> word) {
    if (word == "VmRSS:") {
      std::size_t kb = 0;
      status >> kb;
      return kb * 1024;
    }
  }
  return 0;
}

// User + system CPU seconds of process `pid` so far (-1 when unknown).
inline double cpu_seconds(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  const std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const auto close_paren = text.rfind(')');  // the command name may hold spaces
  if (close_paren == std::string::npos) return -1;
  std::istringstream fields(text.substr(close_paren + 2));
  std::string f;
  double ticks = 0;
  for (int i = 3; i <= 15 && fields >> f; ++i) {
    if (i == 14 || i == 15) ticks += std::stod(f);  // utime, stime
  }
  return ticks / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

// Descriptors process `pid` holds open.
inline std::size_t open_fds(pid_t pid) {
  std::size_t n = 0;
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    ++n;
  }
  return n;
}

// True when the peer closes `fd` within `seconds` (0: only what already arrived); bytes it
// sends first (a notice, say) are read and dropped, even past `seconds` (at most 256 KiB).
inline bool closed_by_peer(int fd, double seconds) {
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(seconds));
  for (int reads_past_deadline = 0; reads_past_deadline < 64;) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, seconds > 0 ? 20 : 0) == 1) {
      uint8_t buf[4096];
      const ssize_t k = ::recv(fd, buf, sizeof(buf), 0);
      if (k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR)) return true;
      if (k > 0 && std::chrono::steady_clock::now() >= deadline) ++reads_past_deadline;
      if (k > 0) continue;  // read on: the end may follow
    }
    if (std::chrono::steady_clock::now() >= deadline) return false;
  }
  return false;
}

}  // namespace gpubox::table::server::testing
