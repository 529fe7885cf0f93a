// gpubox_server's per-host shares (connection_share.hpp: share_address) between real distinct
// hosts: a network namespace of the test's own whose loopback carries 10.9.0.1, 10.9.0.2 and
// 10.9.0.3 besides 127/8, so the server sees peers it counts as three hosts and the loopback one
// (on the machine's own network every local address is loopback: one host). Skipped, naming why,
// where a namespace cannot be made (not root).
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "table/server/connection_share.hpp"
#include "table/server/ps_protocol.hpp"
#include "table/server/server.hpp"
#include "tests/table/server/fake_host_tier.hpp"
#include "tests/table/server/own_network.hpp"
#include "tests/table/server/server_test_util.hpp"

namespace gpubox::table::server {
namespace {

using namespace testing;  // NOLINT: FakeHostTier and the loopback helpers

constexpr char kHostA[] = "10.9.0.1";
constexpr char kHostB[] = "10.9.0.2";
constexpr char kHostC[] = "10.9.0.3";

// Runs `body` in a namespace carrying the three hosts: why it could not ("" when it ran).
std::string in_three_hosts(const std::function<void()>& body) {
  return in_own_network(body, {kHostA, kHostB, kHostC});
}

// The cap's fallback by client gives only a connection at a host holding at least as many as the
// newcomer's. Host B holds eight connections, one per client id (indistinguishable from eight
// trainers); host A a trainer's pool of three. A new id of B takes nothing from A's pool (else B's
// ids would take it, one by one, down to its last connection): refused when it connects, every
// connection kept. A newcomer of host C, holding none, takes one of the pool (client 1 holds the
// most) once it binds, with a notice naming why; B's keep theirs.
TEST(ServerHosts, ANewIdOfAHostHoldingMoreCannotTakeThePoolOfAHostHoldingFewer) {
  const std::string skipped = in_three_hosts([&] {
    FakeHostTier table(test_config());
    ServerOptions so;
    so.max_connections = 11;
    so.frame_deadline_s = 0.2;  // a connection gives its slot once idle that long
    auto server = start_server(&table, so);
    ASSERT_TRUE(server);
    std::vector<Connection> ids_of_b, pool_of_a;
    for (uint64_t id = 100; id < 108; ++id)
      ids_of_b.push_back(connect_as(*server, false, id, kHostB));
    for (int i = 0; i < 3; ++i) pool_of_a.push_back(connect_as(*server, false, 1, kHostA));
    ASSERT_EQ(server->counters().open_connections, 11u);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // all idle past the grace
    for (uint64_t id = 9; id < 12; ++id) {
      Connection newcomer = raw_connection_from(kHostB, server->port());
      const Status st = raw_call(newcomer, Op::kStats, {}, 1, id);
      EXPECT_EQ(st.code(), Status::Code::kResourceExhausted) << id << ": " << st.to_string();
      EXPECT_NE(st.message().find("connection cap"), std::string::npos) << st.to_string();
    }
    EXPECT_EQ(server->counters().fair_share_evicted, 0u);
    for (std::size_t i = 0; i < pool_of_a.size(); ++i) {
      const Status st = raw_call(pool_of_a[i], Op::kStats, {}, 5, 1);
      EXPECT_TRUE(st.ok()) << "pool connection " << i << ": " << st.to_string();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    Connection from_c = connect_as(*server, false, 9, kHostC);
    ASSERT_TRUE(raw_call(from_c, Op::kStats, {}, 2, 9).ok());
    EXPECT_EQ(server->counters().fair_share_evicted, 1u);
    std::vector<std::size_t> evicted;
    ASSERT_TRUE(eventually([&] {
      evicted.clear();
      for (std::size_t i = 0; i < pool_of_a.size(); ++i) {
        if (readable_within(pool_of_a[i].fd(), 0.0)) evicted.push_back(i);
      }
      return !evicted.empty();
    }));
    ASSERT_EQ(evicted.size(), 1u);
    Frame notice;
    ASSERT_TRUE(pool_of_a[evicted[0]]
                    .recv_frame(&notice, kDefaultMaxPayloadBytes, seconds_from_now(2))
                    .ok());
    const std::string why =
        decode_error_reply(notice.header, notice.payload.data(), notice.payload.size()).message();
    for (const char* words :
         {"address 10.9.0.1 holds 3 connections against 0 of 10.9.0.3",
          "client 1 holds 3 connections against 0 of client 9", "to client 9 from 10.9.0.3"}) {
      EXPECT_NE(why.find(words), std::string::npos) << words << ": " << why;
    }
    for (std::size_t i = 0; i < pool_of_a.size(); ++i) {
      if (i == evicted[0]) continue;
      const Status st = raw_call(pool_of_a[i], Op::kStats, {}, 6, 1);
      EXPECT_TRUE(st.ok()) << "pool connection " << i << ": " << st.to_string();
    }
    for (std::size_t i = 0; i < ids_of_b.size(); ++i) {
      const Status st = raw_call(ids_of_b[i], Op::kStats, {}, 5, 100 + i);
      EXPECT_TRUE(st.ok()) << "client " << 100 + i << ": " << st.to_string();
    }
  });
  if (!skipped.empty()) GTEST_SKIP() << skipped;
}

// Held ranged DENSE writes count by host: a local process spreading its client ids over 127.0.0.2,
// 127.0.0.3, ... holds no more than the loopback host's share, however many addresses it takes
// (its new writes take its own idlest ones); trainers of two other hosts then hold writes beside
// it, within their own shares, and commit, no write of the local process dropped for them; at the
// server's limit (the rest filled by one of them) a third host's trainer takes a slot from the
// clients holding the most on the server.
TEST(ServerHosts, ALocalProcessOverManyLoopbackAddressesHoldsOneHostsShare) {
  const std::string skipped = in_three_hosts([&] {
    FakeHostTier table(test_config());
    auto server = start_server(&table);
    ASSERT_TRUE(server);
    std::vector<Connection> hostile;
    for (uint64_t c = 0; c < kMaxHeldDenseWrites; ++c) {
      const std::string source = "127.0.0." + std::to_string(2 + c);
      hostile.push_back(connect_as(*server, false, 1000 + c, source.c_str()));
      const Status st = write_half(hostile.back(), 1000 + c, 1, 0, kFour, 2);
      ASSERT_TRUE(st.ok()) << source << ": " << st.to_string();
      ASSERT_LE(server->counters().dense_held_writes, kMaxHeldDenseWritesPerHost) << source;
    }
    EXPECT_EQ(server->counters().dense_held_writes, kMaxHeldDenseWritesPerHost);
    // Trainers 7 of host A and 8 of host B hold a client's share each beside the local process's
    // writes, none of them taken, and commit.
    const char* hosts[] = {kHostA, kHostB};
    std::vector<Connection> trainers;
    for (uint64_t t = 0; t < 2; ++t) {
      trainers.push_back(connect_as(*server, false, 7 + t, hosts[t]));
      for (uint64_t w = 1; w <= kMaxStagedDenseWrites; ++w) {
        const Status st = write_half(trainers[t], 7 + t, w, 0, kFour, 10 + w);
        ASSERT_TRUE(st.ok()) << hosts[t] << ": " << st.to_string();
      }
    }
    EXPECT_EQ(server->counters().dense_held_writes,
              kMaxHeldDenseWritesPerHost + 2 * kMaxStagedDenseWrites);
    for (uint64_t t = 0; t < 2; ++t) {
      for (uint64_t w = 1; w <= kMaxStagedDenseWrites; ++w) {
        std::vector<uint8_t> reply;
        ASSERT_TRUE(write_half(trainers[t], 7 + t, w, 4, kOtherFour, 20 + w, &reply).ok());
        EXPECT_TRUE(dense_committed(reply, 4)) << hosts[t] << " write " << w;
      }
    }
    EXPECT_EQ(server->counters().dense_held_writes, kMaxHeldDenseWritesPerHost);
    // Host A's clients, 4 writes each, fill its share, and the server is at its limit: a trainer
    // of host C (holding none) takes the slowest write of a client holding the most on the server
    // (all of A's hold 4, as slow: the oldest), not one of the local process's (1 each).
    std::vector<Connection> fillers;
    hold_writes(*server, false, kHostA, 2000, kMaxStagedDenseWrites, kMaxHeldDenseWrites, &fillers);
    ASSERT_EQ(server->counters().dense_held_writes, kMaxHeldDenseWrites);
    write_commits(*server, false, kHostC, 9);
    EXPECT_EQ(server->counters().dense_held_writes, kMaxHeldDenseWrites - 1);
    const Status dropped = write_half(fillers.front(), 2000, 1, 4, kOtherFour, 30);
    EXPECT_EQ(dropped.code(), Status::Code::kNotFound) << dropped.to_string();
    EXPECT_NE(dropped.message().find("write 1 was dropped: its slot went to a write of another "
                                     "client (the slowest of a client holding 4"),
              std::string::npos)
        << dropped.to_string();
    EXPECT_NE(dropped.message().find("this server already holds 64"), std::string::npos)
        << dropped.to_string();
  });
  if (!skipped.empty()) GTEST_SKIP() << skipped;
}

}  // namespace
}  // namespace gpubox::table::server
