// A free TCP port on 127.0.0.1 for a test server that the test stops and starts again on the
// same port (a restart a client must reach without being told a new endpoint); the C++ twin of
// tests/scripts/free_port.py.
//
// The port is drawn below the kernel's ephemeral range (/proc/sys/net/ipv4/ip_local_port_range):
// a server started on port 0 gets its port from that range, and so do every outgoing connection
// and every --port 0 server of the tests running beside it, any of which can take the port in the
// moment between the stop and the restart. Below the range only another test's drawn port can
// collide (one chance in thousands), and the draw checks that the port binds.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <random>
#include <stdexcept>
#include <string>

namespace gpubox::testing {

inline uint16_t port_below_ephemeral_range() {
  int high = 32768;
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  if (!(range >> high) || high <= 1024 || high > 65536) high = 32768;
  const int low = high > 12000 ? 10000 : 1024;
  std::random_device seed;
  std::mt19937 rng(seed());
  std::uniform_int_distribution<int> draw(low, high - 1);
  for (int tries = 0; tries < 200; ++tries) {
    const auto port = static_cast<uint16_t>(draw(rng));
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) break;
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(port);
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const bool free = ::bind(fd, reinterpret_cast<const sockaddr*>(&address), sizeof address) == 0;
    ::close(fd);
    if (free) return port;
  }
  throw std::runtime_error("port_below_ephemeral_range: no free port in " + std::to_string(low) +
                           ".." + std::to_string(high - 1) + " after 200 draws");
}

}  // namespace gpubox::testing
