// A network namespace of a test's own: its loopback up or down, and IPv4 addresses of other
// "hosts" on it (10.9.0.1, 10.9.0.2, ...: the server sees peers that share_address counts apart,
// which the machine's 127/8 cannot give, every loopback address being one host). Needs the right to
// make a network namespace (root); a test without it skips, naming why. Nothing of the machine's
// own network is touched: the namespace goes with the thread that made it.
#pragma once

#include <arpa/inet.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <string>
#include <thread>

namespace gpubox::table::server::testing {

// Sets this thread's network namespace's loopback up or down; false (errno set) on failure.
inline bool set_loopback(bool up) {
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  ifreq request{};
  std::strncpy(request.ifr_name, "lo", IFNAMSIZ - 1);
  bool ok = ::ioctl(fd, SIOCGIFFLAGS, &request) == 0;
  if (ok) {
    request.ifr_flags =
        static_cast<short>(up ? (request.ifr_flags | IFF_UP) : (request.ifr_flags & ~IFF_UP));
    ok = ::ioctl(fd, SIOCSIFFLAGS, &request) == 0;
  }
  ::close(fd);
  return ok;
}

// Adds IPv4 `address` (/32) to this thread's namespace's loopback as alias "lo:`label`": sockets
// bound to it reach the server on 127.0.0.1, which sees it as their peer. False (errno set) on
// failure.
inline bool add_loopback_address(const char* address, int label) {
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  ifreq request{};
  std::snprintf(request.ifr_name, IFNAMSIZ, "lo:%d", label);
  sockaddr_in in{};
  in.sin_family = AF_INET;
  bool ok = ::inet_pton(AF_INET, address, &in.sin_addr) == 1;
  if (!ok) errno = EINVAL;
  std::memcpy(&request.ifr_addr, &in, sizeof(in));
  ok = ok && ::ioctl(fd, SIOCSIFADDR, &request) == 0;
  in.sin_addr.s_addr = INADDR_NONE;  // 255.255.255.255
  std::memcpy(&request.ifr_netmask, &in, sizeof(in));
  ok = ok && ::ioctl(fd, SIOCSIFNETMASK, &request) == 0;
  const int err = errno;
  ::close(fd);
  errno = err;
  return ok;
}

// Runs `body` in a network namespace of its own thread's, its loopback up and carrying `hosts`
// (the server threads it starts inherit it; the rest of the test binary keeps the machine's).
// Returns why it could not ("" when it ran).
inline std::string in_own_network(const std::function<void()>& body,
                                  std::initializer_list<const char*> hosts = {}) {
  std::string skipped;
  std::thread isolated([&] {
    if (::unshare(CLONE_NEWNET) != 0 || !set_loopback(true)) {
      skipped =
          std::string("cannot make a network namespace with a loopback: ") + std::strerror(errno);
      return;
    }
    int label = 0;
    for (const char* host : hosts) {
      if (!add_loopback_address(host, ++label)) {
        skipped = std::string("cannot add ") + host +
                  " to the namespace's loopback: " + std::strerror(errno);
        return;
      }
    }
    body();
  });
  isolated.join();
  return skipped;
}

}  // namespace gpubox::table::server::testing
