// gpubox_server at --max_connections, in-process on loopback (connection_share.hpp): a process
// holding the token fills the cap under many client ids, and a trainer's client still connects
// and completes its PULL and PUSH (an idle connection of the client holding the most gives its
// slot, with a notice saying why; the trainer reconnects what it loses); unauthenticated
// connections wait beyond the cap but never evict an authenticated one; without a token,
// connections that never sent a frame give way to a client that speaks.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "table/server/connection_share.hpp"
#include "tests/table/server/fake_host_tier.hpp"
#include "tests/table/server/server_test_util.hpp"

namespace gpubox::table::server {
namespace {

using namespace testing;  // NOLINT: FakeHostTier and the loopback helpers

constexpr std::size_t kCap = 8;

// What the server's notice on `conn` says, once it closed it (empty: no notice came).
std::string notice_on(Connection& conn) {
  Frame notice;
  if (!conn.recv_frame(&notice, kDefaultMaxPayloadBytes, seconds_from_now(2)).ok()) return "";
  if (notice.header.request_id != kNoticeRequestId) return "not a notice";
  return decode_error_reply(notice.header, notice.payload.data(), notice.payload.size()).message();
}

// A trainer's client of `server` as `client_id`.
std::unique_ptr<RemoteHostTier> trainer_client(const Server& server, bool token,
                                               uint64_t client_id) {
  auto options = client_options(server.endpoint());
  if (token) options.auth_token = kTestToken;
  options.client_id = client_id;
  return connect_client(options);
}

// `trainer` (its second connection per endpoint refused and retried on its first, where the
// cap's share gives it only one) pulls and pushes `n` rows; asserts both complete and the table
// holds them.
void pulls_and_pushes(RemoteHostTier& trainer, FakeHostTier& table, uint64_t client_id,
                      std::size_t n) {
  std::vector<uint64_t> keys(n);
  for (std::size_t i = 0; i < n; ++i) keys[i] = 1 + 1000 * client_id + i;
  std::vector<float> rows(n * trainer.layout().stride(), 0.25f);
  Status st = trainer.pull(keys.data(), nullptr, n, rows.data(), nullptr);
  ASSERT_TRUE(st.ok()) << st.to_string();
  st = trainer.push(keys.data(), n, rows.data());
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_GE(table.size(), n);
}

void trainer_pulls_and_pushes(const Server& server, FakeHostTier& table, bool token,
                              uint64_t client_id, std::size_t n) {
  auto trainer = trainer_client(server, token, client_id);
  ASSERT_TRUE(trainer);
  pulls_and_pushes(*trainer, table, client_id, n);
}

TEST(CapShare, AHostileTokenHolderWithManyIdsCannotKeepATrainerOut) {
  FakeHostTier table(test_config());
  ServerOptions so;
  so.auth_token = kTestToken;
  so.max_connections = kCap;
  auto server = start_server(&table, so);
  ASSERT_TRUE(server);
  // Four ids of two authenticated connections each fill the cap, and stay idle.
  std::vector<Connection> hostile;
  for (uint64_t id = 100; id < 104; ++id) {
    for (int i = 0; i < 2; ++i) hostile.push_back(connect_as(*server, true, id));
  }
  ASSERT_EQ(server->counters().open_connections, kCap);
  auto trainer = trainer_client(*server, true, 7);
  ASSERT_TRUE(trainer);
  pulls_and_pushes(*trainer, table, 7, 300);
  EXPECT_GE(server->counters().fair_share_evicted, 1u);
  // The evicted read why; the others are still served.
  std::size_t evicted = 0;
  for (std::size_t i = 0; i < hostile.size(); ++i) {
    if (!readable_within(hostile[i].fd(), 0.0)) {
      const Status st = raw_call(hostile[i], Op::kStats, {}, 9, 100 + i / 2);
      EXPECT_TRUE(st.ok()) << i << ": " << st.to_string();
      continue;
    }
    ++evicted;
    const std::string why = notice_on(hostile[i]);
    EXPECT_NE(why.find("evicted: the server is at its connection cap (8, --max_connections)"),
              std::string::npos)
        << why;
    EXPECT_NE(why.find("to client 7 from 127.0.0.1; reconnect"), std::string::npos) << why;
  }
  EXPECT_EQ(evicted, server->counters().fair_share_evicted);
  EXPECT_LE(server->counters().open_connections - server->counters().waiting_over_cap, kCap);
  // A hostile id whose connection went cannot take it back from the trainer (which holds no more
  // than the others): refused with the cap's notice, while the trainer is served again.
  ASSERT_TRUE(eventually([&] { return server->counters().open_connections == kCap; }));
  Connection back = raw_connection(server->port());
  const Status st = raw_authenticate(back, kTestToken, 100);
  EXPECT_EQ(st.code(), Status::Code::kResourceExhausted) << st.to_string();
  EXPECT_NE(st.message().find("server at its connection cap (8"), std::string::npos)
      << st.to_string();
  pulls_and_pushes(*trainer, table, 7, 50);
}

// One connection per id, but all of one other address: that address holds more than the
// trainer's, whose client takes a slot there.
TEST(CapShare, ManyIdsOfOneConnectionEachFromAnotherAddressGiveWay) {
  FakeHostTier table(test_config());
  ServerOptions so;
  so.auth_token = kTestToken;
  so.max_connections = kCap;
  auto server = start_server(&table, so);
  ASSERT_TRUE(server);
  std::vector<Connection> hostile;
  for (uint64_t id = 100; id < 100 + kCap; ++id) {
    hostile.push_back(connect_as(*server, true, id, "127.0.0.2"));
  }
  // From the same address, a new id finds no one holding more than itself.
  Connection same = raw_connection_from("127.0.0.2", server->port());
  EXPECT_EQ(raw_authenticate(same, kTestToken, 200).code(), Status::Code::kResourceExhausted);
  trainer_pulls_and_pushes(*server, table, true, 7, 100);
  EXPECT_GE(server->counters().fair_share_evicted, 1u);
  std::size_t evicted = 0;
  for (auto& c : hostile) {
    if (!readable_within(c.fd(), 0.0)) continue;
    ++evicted;
    const std::string why = notice_on(c);  // 8 against 0, then (its second) 7 against 1
    EXPECT_NE(why.find("address 127.0.0.2 holds "), std::string::npos) << why;
    EXPECT_NE(why.find(" of 127.0.0.1; of them client "), std::string::npos) << why;
  }
  EXPECT_GE(evicted, 1u);
}

TEST(CapShare, UnauthenticatedConnectionsWaitBeyondTheCapButNeverEvict) {
  FakeHostTier table(test_config());
  ServerOptions so;
  so.auth_token = kTestToken;
  so.max_connections = kCap;
  so.auth_backoff_base_s = 0;  // the wrong proofs below do not slow the trainer's right one
  auto server = start_server(&table, so);
  ASSERT_TRUE(server);
  std::vector<Connection> held;
  for (uint64_t id = 100; id < 104; ++id) {
    for (int i = 0; i < 2; ++i) held.push_back(connect_as(*server, true, id));
  }
  // A flood: connections that never authenticate, and ones whose proof is wrong.
  std::vector<Connection> flood;
  for (int i = 0; i < 40; ++i) {
    flood.push_back(raw_connection(server->port()));
    if (i % 4 == 0) {
      EXPECT_FALSE(
          raw_authenticate(flood.back(), "wrong-token-wrong-token-wrong-tok", 500 + i).ok());
    }
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const ServerCounters during = server->counters();
  EXPECT_EQ(during.fair_share_evicted, 0u);
  EXPECT_LE(during.waiting_over_cap, kMaxWaitingOverCap);
  EXPECT_LE(during.open_connections, kCap + kMaxWaitingOverCap);
  for (std::size_t i = 0; i < held.size(); ++i) {
    EXPECT_FALSE(readable_within(held[i].fd(), 0.0)) << "authenticated connection " << i;
    const Status st = raw_call(held[i], Op::kStats, {}, 20 + i, 100 + i / 2);
    EXPECT_TRUE(st.ok()) << i << ": " << st.to_string();
  }
  // The right token still gets a slot (one of the held gives it), the flood notwithstanding.
  trainer_pulls_and_pushes(*server, table, true, 7, 100);
  EXPECT_GE(server->counters().fair_share_evicted, 1u);
}

TEST(CapShare, WithoutATokenSilentConnectionsGiveWayToAClientThatSpeaks) {
  FakeHostTier table(test_config());
  ServerOptions so;
  so.max_connections = 4;
  auto server = start_server(&table, so);
  ASSERT_TRUE(server);
  std::vector<Connection> silent;
  for (int i = 0; i < 4; ++i) silent.push_back(raw_connection(server->port()));
  ASSERT_TRUE(eventually([&] { return server->counters().open_connections == 4; }));
  trainer_pulls_and_pushes(*server, table, false, 3, 200);
  EXPECT_GE(server->counters().fair_share_evicted, 1u);
  std::size_t closed = 0;
  for (auto& c : silent) {
    if (!readable_within(c.fd(), 0.0)) continue;
    ++closed;
    EXPECT_NE(notice_on(c).find("the unbound connections of 127.0.0.1 holds"), std::string::npos);
  }
  EXPECT_EQ(closed, server->counters().fair_share_evicted);
}

}  // namespace
}  // namespace gpubox::table::server
