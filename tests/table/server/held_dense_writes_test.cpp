// Ranged DENSE writes held by the server (ps_store.hpp) against a client that takes a new client id
// on every connection: it is still one peer address, held to its share of the server's slots, and
// the writes it abandons (its connections closed) give way to an honest trainer's, but not before
// a trainer whose connection closed under it could reconnect and finish; a writer whose
// connection went half-open (the peer vanished without closing it, which the server sees only by
// TCP keepalive, set on every connection it accepts) gets its slot back when it writes the table
// again.
#include <arpa/inet.h>
#include <dirent.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <cstdlib>
#include <string>
#include <thread>

#include "table/server/ps_protocol.hpp"
#include "table/server/server.hpp"
#include "tests/table/server/fake_host_tier.hpp"
#include "tests/table/server/server_test_util.hpp"

namespace gpubox::table::server {
namespace {

using namespace testing;  // NOLINT: FakeHostTier and the loopback helpers

const std::vector<float> kFour = {1.0f, 2.0f, 3.0f, 4.0f};
const std::vector<float> kOtherFour = {5.0f, 6.0f, 7.0f, 8.0f};

// The first range of write `write` of table "dense" (8 values) from `client`.
Status start_write(Connection& conn, uint64_t client, uint64_t write, uint64_t request_id) {
  return raw_dense(conn, dense_range(DenseAction::kWrite, 8, 0, 4, write), &kFour, request_id,
                   nullptr, client);
}

// An honest trainer's whole ranged write of "dense" (two ranges): committed, values as written.
void honest_write_commits(const Server& server, const char* source, uint64_t client) {
  Connection conn = connect_as(server, false, client, source);
  std::vector<uint8_t> reply;
  Status st = start_write(conn, client, 1, 2);
  ASSERT_TRUE(st.ok()) << source << ": " << st.to_string();
  st =
      raw_dense(conn, dense_range(DenseAction::kWrite, 8, 4, 4, 1), &kOtherFour, 3, &reply, client);
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_TRUE(dense_committed(reply, 4));
}

// A client taking a new id on a new connection for every 4 writes, closing each: before, its
// abandoned writes filled all 64 slots for dense_write_max_idle_s and an honest trainer was
// refused; now they fill its address's share, and once they received no range for a quarter of
// dense_write_max_idle_s the longest idle one gives way to a trainer of its address (logged).
TEST(HeldDenseWrites, AbandonedWritesOfARotatingClientGiveWayToAnHonestTrainer) {
  FakeHostTier table(test_config());
  ServerOptions so;
  so.dense_write_max_idle_s = 8.0;  // taken after 2 s; dropped by the sweep after 8 s
  auto server = start_server(&table, so);
  ASSERT_TRUE(server);
  for (uint64_t c = 1000; c < 1000 + kMaxHeldDenseWritesPerAddress / kMaxStagedDenseWrites; ++c) {
    Connection rotating = connect_as(*server, false, c);
    for (uint64_t w = 1; w <= kMaxStagedDenseWrites; ++w) {
      const Status st = start_write(rotating, c, w, 10 + w);
      ASSERT_TRUE(st.ok()) << "client " << c << ": " << st.to_string();
    }
  }
  ASSERT_TRUE(eventually([&] { return server->counters().open_connections == 0; }));
  EXPECT_EQ(server->counters().dense_held_writes, kMaxHeldDenseWritesPerAddress);
  std::this_thread::sleep_for(std::chrono::milliseconds(2200));
  honest_write_commits(*server, "127.0.0.1", 7);
  honest_write_commits(*server, "127.0.0.2", 8);
  EXPECT_LE(server->counters().dense_held_writes, kMaxHeldDenseWritesPerAddress);
}

// A trainer whose connection closed under it (a transport retry) reconnects at once and finishes
// its write: a client of its address at the address's limit meanwhile is refused, not given the
// trainer's slot (a write whose connections closed is taken for abandoned only once it received
// no range for a quarter of dense_write_max_idle_s). Before, the trainer's write was dropped and
// its last range did not commit.
TEST(HeldDenseWrites, AWriterThatReconnectsAtOnceKeepsItsWriteAtTheLimit) {
  FakeHostTier table(test_config());
  ServerOptions so;
  so.dense_write_max_idle_s = 20.0;  // a grace of 5 s: far more than this test takes
  auto server = start_server(&table, so);
  ASSERT_TRUE(server);
  {
    Connection lost = connect_as(*server, false, 7);
    ASSERT_TRUE(start_write(lost, 7, 1, 2).ok());
  }
  ASSERT_TRUE(eventually([&] { return server->counters().open_connections == 0; }));
  std::vector<Connection> open;  // other clients of 127.0.0.1 fill its share, on open connections
  std::size_t held = 1;
  for (uint64_t c = 1000; held < kMaxHeldDenseWritesPerAddress; ++c) {
    open.push_back(connect_as(*server, false, c));
    for (uint64_t w = 1; w <= kMaxStagedDenseWrites && held < kMaxHeldDenseWritesPerAddress;
         ++w, ++held) {
      const Status st = start_write(open.back(), c, w, 10 + w);
      ASSERT_TRUE(st.ok()) << "client " << c << ": " << st.to_string();
    }
  }
  Connection late = connect_as(*server, false, 2000);
  const Status refused = start_write(late, 2000, 1, 2);
  EXPECT_EQ(refused.code(), Status::Code::kResourceExhausted) << refused.to_string();
  EXPECT_NE(refused.message().find("peer 127.0.0.1 already holds 32"), std::string::npos)
      << refused.to_string();
  EXPECT_NE(refused.message().find("given a range in the last 5 s"), std::string::npos)
      << refused.to_string();
  Connection again = connect_as(*server, false, 7);
  std::vector<uint8_t> reply;
  ASSERT_TRUE(
      raw_dense(again, dense_range(DenseAction::kWrite, 8, 4, 4, 1), &kOtherFour, 3, &reply, 7)
          .ok());
  EXPECT_TRUE(dense_committed(reply, 4));
  EXPECT_EQ(server->counters().dense_held_writes, kMaxHeldDenseWritesPerAddress - 1);
}

// The same client keeping its connections open: refused at its address's share, naming the peer
// and the limit; a trainer of another host still writes.
TEST(HeldDenseWrites, ARotatingClientOnOpenConnectionsIsHeldToItsAddressesShare) {
  FakeHostTier table(test_config());
  auto server = start_server(&table);
  ASSERT_TRUE(server);
  std::vector<Connection> open;
  Status refused;
  for (uint64_t c = 1000; c < 1000 + kMaxHeldDenseWrites && refused.ok(); ++c) {
    open.push_back(connect_as(*server, false, c));
    for (uint64_t w = 1; w <= kMaxStagedDenseWrites && refused.ok(); ++w) {
      refused = start_write(open.back(), c, w, 10 + w);
    }
  }
  EXPECT_EQ(refused.code(), Status::Code::kResourceExhausted) << refused.to_string();
  EXPECT_NE(refused.message().find("from 127.0.0.1: peer 127.0.0.1 already holds 32 ranged "
                                   "writes of its clients"),
            std::string::npos)
      << refused.to_string();
  EXPECT_EQ(server->counters().dense_held_writes, kMaxHeldDenseWritesPerAddress);
  honest_write_commits(*server, "127.0.0.2", 7);
  EXPECT_EQ(server->counters().dense_held_writes, kMaxHeldDenseWritesPerAddress);
}

// A writer whose connection went half-open (here: left open and silent) starts its write of the
// table again on a new connection: its stale write (no range for a quarter of
// dense_write_max_idle_s) is released at once, not held until the idle sweep; a write that is
// still moving (another thread of the client writing the table) is not.
TEST(HeldDenseWrites, ARewriteSupersedesTheSameClientsStaleWriteOnAHalfOpenConnection) {
  FakeHostTier table(test_config());
  ServerOptions so;
  so.dense_write_max_idle_s = 8.0;  // stale after 2 s; dropped by the sweep after 8 s
  auto server = start_server(&table, so);
  ASSERT_TRUE(server);
  Connection half_open = connect_as(*server, false, 5);
  ASSERT_TRUE(start_write(half_open, 5, 1, 2).ok());
  Connection again = connect_as(*server, false, 5);
  ASSERT_TRUE(start_write(again, 5, 2, 2).ok());
  EXPECT_EQ(server->counters().dense_held_writes, 2u);  // write 1 is moving: kept
  std::this_thread::sleep_for(std::chrono::milliseconds(2200));
  std::vector<uint8_t> reply;
  ASSERT_TRUE(
      raw_dense(again, dense_range(DenseAction::kWrite, 8, 4, 4, 2), &kOtherFour, 3, &reply, 5)
          .ok());
  EXPECT_TRUE(dense_committed(reply, 4));
  EXPECT_EQ(server->counters().dense_held_writes, 1u);  // write 1, stale
  const Status st = start_write(again, 5, 3, 4);
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(server->counters().dense_held_writes, 1u);  // write 3 alone: write 1 superseded
  // The stale write's range arriving late finds nothing held: a write that never commits.
  std::vector<uint8_t> late;
  ASSERT_TRUE(
      raw_dense(half_open, dense_range(DenseAction::kWrite, 8, 4, 4, 1), &kOtherFour, 3, &late, 5)
          .ok());
  EXPECT_FALSE(dense_committed(late, 4));
}

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

// The server (in this process) accepted `conn` with TCP keepalive on: the descriptor whose local
// port is the server's and whose peer is conn's end probes after 60 s of silence, so a half-open
// peer is found in 2 minutes, not at --idle_timeout_s.
TEST(HeldDenseWrites, AcceptedConnectionsProbeAHalfOpenPeerByKeepalive) {
  FakeHostTier table(test_config());
  auto server = start_server(&table);
  ASSERT_TRUE(server);
  Connection conn = connect_as(*server, false, 11);  // the session began: accepted and set up
  const uint16_t mine = port_of(conn.fd(), false);
  ASSERT_NE(mine, 0);
  EXPECT_EQ(int_option(conn.fd(), SOL_SOCKET, SO_KEEPALIVE), 0);  // the client's end: not set
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
  EXPECT_EQ(int_option(accepted, SOL_SOCKET, SO_KEEPALIVE), 1);
  EXPECT_EQ(int_option(accepted, IPPROTO_TCP, TCP_KEEPIDLE), 60);
  EXPECT_EQ(int_option(accepted, IPPROTO_TCP, TCP_KEEPINTVL), 10);
  EXPECT_EQ(int_option(accepted, IPPROTO_TCP, TCP_KEEPCNT), 6);
}

}  // namespace
}  // namespace gpubox::table::server
