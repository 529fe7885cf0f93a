// TCP keepalive on both ends (connection_limits.hpp): the server's accepted connections and the
// client's find a peer that vanished without closing the connection (its machine lost or cut
// off: no RST ever comes) within idle + interval * probes seconds, not at the OS default of two
// hours. The vanished server is made for real: the client and the server run in a network
// namespace of this test's own whose loopback is taken down under a waiting BARRIER, so nothing
// answers the probes or acknowledges what was sent (skipped where namespaces cannot be made: not
// root).
#include <arpa/inet.h>
#include <dirent.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "table/server/remote_host_tier.hpp"
#include "table/server/server.hpp"
#include "tests/table/server/fake_host_tier.hpp"
#include "tests/table/server/own_network.hpp"
#include "tests/table/server/server_test_util.hpp"

namespace gpubox::table::server {
namespace {

using namespace testing;  // NOLINT: FakeHostTier and the loopback helpers

// The local port of socket `fd` (0 when it is not an IPv4 socket); with `peer`, its peer's.
uint16_t port_of(int fd, bool peer) {
  sockaddr_in addr{};
  socklen_t len = sizeof(addr);
  const int rc = peer ? ::getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len)
                      : ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  return rc == 0 && addr.sin_family == AF_INET ? ntohs(addr.sin_port) : 0;
}

int int_option(int fd, int level, int name) {
  int value = -1;
  socklen_t len = sizeof(value);
  return ::getsockopt(fd, level, name, &value, &len) == 0 ? value : -1;
}

// Whether `fd` probes a silent peer at `keepalive`'s times.
void expect_keepalive(int fd, const TcpKeepalive& keepalive, const char* which) {
  EXPECT_EQ(int_option(fd, SOL_SOCKET, SO_KEEPALIVE), 1) << which;
  EXPECT_EQ(int_option(fd, IPPROTO_TCP, TCP_KEEPIDLE), keepalive.idle_s) << which;
  EXPECT_EQ(int_option(fd, IPPROTO_TCP, TCP_KEEPINTVL), keepalive.interval_s) << which;
  EXPECT_EQ(int_option(fd, IPPROTO_TCP, TCP_KEEPCNT), keepalive.probes) << which;
  EXPECT_EQ(int_option(fd, IPPROTO_TCP, TCP_USER_TIMEOUT), 1000 * keepalive.user_timeout())
      << which;
}

// The server (in this process) accepted `conn` with TCP keepalive on: the descriptor whose local
// port is the server's and whose peer is conn's end probes after 60 s of silence, so a half-open
// peer is found in 2 minutes, not at --idle_timeout_s.
TEST(Keepalive, AcceptedConnectionsProbeAHalfOpenPeer) {
  FakeHostTier table(test_config());
  auto server = start_server(&table);
  ASSERT_TRUE(server);
  Connection conn = connect_as(*server, false, 11);  // the session began: accepted and set up
  const uint16_t mine = port_of(conn.fd(), false);
  ASSERT_NE(mine, 0);
  EXPECT_EQ(int_option(conn.fd(), SOL_SOCKET, SO_KEEPALIVE), 0);  // a raw test socket: not set
  int accepted = -1;
  DIR* fds = ::opendir("/proc/self/fd");
  if (fds == nullptr) GTEST_SKIP() << "no /proc/self/fd to find the server's end of the connection";
  while (const dirent* entry = ::readdir(fds)) {
    const int fd = std::atoi(entry->d_name);
    if (fd > 2 && fd != conn.fd() && port_of(fd, false) == server->port() &&
        port_of(fd, true) == mine) {
      accepted = fd;
    }
  }
  ::closedir(fds);
  ASSERT_GE(accepted, 0) << "no descriptor of this process is the server's end of port " << mine;
  expect_keepalive(accepted, TcpKeepalive{}, "the server's end");
}

// The client's connections (Connection::open, which the transport opens every connection with)
// probe at the default times, or at the ones it is given.
TEST(Keepalive, ClientConnectionsProbeTheServer) {
  FakeHostTier table(test_config());
  auto server = start_server(&table);
  ASSERT_TRUE(server);
  const Endpoint endpoint{"127.0.0.1", server->port()};
  auto plain = Connection::open(endpoint, seconds_from_now(2));
  ASSERT_TRUE(plain.ok()) << plain.status().to_string();
  expect_keepalive(plain->fd(), TcpKeepalive{}, "the default");
  const TcpKeepalive brisk{3, 2, 4};
  auto shortened = Connection::open(endpoint, seconds_from_now(2), brisk);
  ASSERT_TRUE(shortened.ok()) << shortened.status().to_string();
  expect_keepalive(shortened->fd(), brisk, "shortened");
  TcpKeepalive patient = brisk;
  patient.user_timeout_s = 300;
  auto lasting = Connection::open(endpoint, seconds_from_now(2), patient);
  ASSERT_TRUE(lasting.ok()) << lasting.status().to_string();
  expect_keepalive(lasting->fd(), patient, "a user timeout of its own");
}

// A client's TCP_USER_TIMEOUT lasts as long as its longest call (which then gives up itself,
// naming the server), and never less than the probes: a live server busy in a long SAVE, its
// receive window closed under big pipelined frames, is waited on as long as the call waits.
TEST(Keepalive, AClientsUserTimeoutOutlastsItsLongestCall) {
  const TcpKeepalive keepalive;  // 60 + 10 * 6 = 120 s
  EXPECT_EQ(client_user_timeout_s(keepalive, 0.0), 120);
  EXPECT_EQ(client_user_timeout_s(keepalive, 120.5), 121);
  // Two lanes of two 64 MiB frames at 1 MiB/s after a 30 s deadline: 286 s.
  EXPECT_EQ(client_user_timeout_s(keepalive, 30.0 + 4 * 64.0), 286);
  EXPECT_EQ(client_user_timeout_s(keepalive, 285.5), 286);
  EXPECT_EQ(client_user_timeout_s(keepalive, 1e12), INT32_MAX / 1000);  // no overflow
  TcpKeepalive longer;
  longer.user_timeout_s = 1000;
  EXPECT_EQ(client_user_timeout_s(longer, 30.0), 1000);  // one set longer is kept
}

// A trainer waits at a BARRIER (for a minute) on a server whose machine then vanishes (the
// connection silent: probes find it): with probes after 1 s of silence, 1 s apart, 2 of them, the
// wait fails within seconds with an error naming the server, not at the barrier's minute nor the
// OS's two hours.
TEST(Keepalive, ATrainerWaitingOnAVanishedServerFailsNamingIt) {
  Status waited_for;
  double seconds = 0.0;
  std::string endpoint;
  const std::string skipped = in_own_network([&] {
    FakeHostTier table(test_config());
    auto server = start_server(&table);
    if (!server) return;
    endpoint = server->endpoint();
    auto options = client_options(endpoint);
    options.keepalive = TcpKeepalive{1, 1, 2};
    // Its longest call (a DENSE window of 4 frames of 64 KiB after the 3 s deadline) is shorter
    // than the probes: TCP_USER_TIMEOUT, which also bounds unanswered probes, is theirs.
    options.max_payload_bytes = 64 << 10;
    auto client = connect_client(options);
    if (!client) return;
    std::thread vanish([&] {
      EXPECT_TRUE(eventually([&] { return server->counters().barrier_waiters == 1; }))
          << "the BARRIER never arrived";
      EXPECT_TRUE(set_loopback(false)) << std::strerror(errno);
    });
    const auto start = Clock::now();
    waited_for = client->barrier("vanishing", 2, 60.0);
    seconds = std::chrono::duration<double>(Clock::now() - start).count();
    vanish.join();
  });
  if (!skipped.empty()) GTEST_SKIP() << skipped;
  ASSERT_FALSE(endpoint.empty());
  EXPECT_EQ(waited_for.code(), Status::Code::kUnavailable) << waited_for.to_string();
  EXPECT_NE(waited_for.message().find("BARRIER to " + endpoint), std::string::npos)
      << waited_for.to_string();
  EXPECT_NE(waited_for.message().find("timed out"), std::string::npos) << waited_for.to_string();
  EXPECT_GT(seconds, 2.0) << waited_for.to_string();   // the probes' time: not a refusal
  EXPECT_LT(seconds, 15.0) << waited_for.to_string();  // not the barrier's minute
}

// A request sent on an open connection just after its server vanished is never acknowledged, so
// no probe goes: TCP_USER_TIMEOUT (as long as the probes take) ends the wait for its reply within
// seconds, not at the request's minute nor after the OS's 15 minutes of retransmissions.
TEST(Keepalive, ARequestTheVanishedServerNeverAcknowledgedFails) {
  Status waited_for;
  double seconds = 0.0;
  const std::string skipped = in_own_network([&] {
    FakeHostTier table(test_config());
    auto server = start_server(&table);
    if (!server) return;
    auto conn = Connection::open(Endpoint{"127.0.0.1", server->port()}, seconds_from_now(2),
                                 TcpKeepalive{1, 1, 2});
    ASSERT_TRUE(conn.ok()) << conn.status().to_string();
    ASSERT_TRUE(set_loopback(false)) << std::strerror(errno);
    FrameHeader h;
    h.op = Op::kBarrier;
    h.request_id = 1;
    h.client_id = 1;
    std::vector<uint8_t> payload;
    encode_barrier_request("vanishing", 2, &payload);
    const auto start = Clock::now();
    waited_for = conn->call(h, payload, kDefaultMaxPayloadBytes, seconds_from_now(60)).status();
    seconds = std::chrono::duration<double>(Clock::now() - start).count();
  });
  if (!skipped.empty()) GTEST_SKIP() << skipped;
  EXPECT_EQ(waited_for.code(), Status::Code::kUnavailable) << waited_for.to_string();
  EXPECT_NE(waited_for.message().find("timed out"), std::string::npos) << waited_for.to_string();
  EXPECT_GT(seconds, 2.0) << waited_for.to_string();
  EXPECT_LT(seconds, 15.0) << waited_for.to_string();
}

}  // namespace
}  // namespace gpubox::table::server
