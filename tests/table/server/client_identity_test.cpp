// A connection speaks for one client (session.hpp): the client id its AUTH proved, or its first
// frame's on a server without a token. A frame carrying another id is refused, naming the peer and
// both ids, and its connection closed; what the server keeps per client (held DENSE writes, the
// retry cache) is keyed and capped by that bound id, so one client cannot take all of it or push
// out another's; a client's rewrite of a table releases its own write of it whose connections all
// closed, never a write of a live connection (one client may write from two threads).
#include <gtest/gtest.h>

#include <cstring>
#include <thread>

#include "table/server/ps_protocol.hpp"
#include "table/server/remote_host_tier.hpp"
#include "table/server/request_window.hpp"
#include "table/server/server.hpp"
#include "tests/table/server/fake_host_tier.hpp"
#include "tests/table/server/server_test_util.hpp"

namespace gpubox::table::server {
namespace {

using namespace testing;  // NOLINT: FakeHostTier and the loopback helpers

ServerOptions options_with(bool token) {
  ServerOptions so;
  if (token) so.auth_token = kTestToken;
  return so;
}

std::vector<uint8_t> one_row_push(uint64_t key, uint32_t stride) {
  std::vector<float> row(stride, 0.5f);
  std::vector<uint8_t> p;
  encode_push_request(&key, 1, row.data(), stride, &p);
  return p;
}

// The values of table "dense" (8 of them), read on `conn` as `client`.
std::vector<float> read_dense(Connection& conn, uint64_t client, uint64_t request_id) {
  std::vector<uint8_t> reply;
  const Status st = raw_dense(conn, dense_range(DenseAction::kRead, 8, 0, 8), nullptr, request_id,
                              &reply, client);
  EXPECT_TRUE(st.ok()) << st.to_string();
  auto head = decode_dense_reply(reply.data(), reply.size(), 0, 8);
  std::vector<float> values(8, -1.0f);
  if (head.ok()) std::memcpy(values.data(), head->values, sizeof(float) * 8);
  return values;
}

class ClientIdentity : public ::testing::TestWithParam<bool> {};  // the server has a token

TEST_P(ClientIdentity, AClientThatSwitchesIdsIsRefusedNamingBothAndOthersAreServed) {
  const bool token = GetParam();
  FakeHostTier table(test_config());
  auto server = start_server(&table, options_with(token));
  ASSERT_TRUE(server);
  const uint32_t stride = static_cast<uint32_t>(table.layout().stride());
  Connection switcher = connect_as(*server, token, 3);
  Connection other = connect_as(*server, token, 4);
  ASSERT_TRUE(raw_call(switcher, Op::kPush, one_row_push(10, stride), 2, 3).ok());
  // The same connection speaking for client 4: refused from the header, nothing applied.
  const Status st = raw_call(switcher, Op::kPush, one_row_push(11, stride), 3, 4);
  EXPECT_EQ(st.code(), Status::Code::kPermissionDenied) << st.to_string();
  for (const char* words :
       {"PUSH request 3 from 127.0.0.1:", "carries client id 4", "bound to client id 3",
        token ? "(proved by its AUTH)" : "(its first frame's)", "connection closed"}) {
    EXPECT_NE(st.message().find(words), std::string::npos) << words << ": " << st.to_string();
  }
  EXPECT_TRUE(closed_by_peer(switcher.fd(), 3.0));
  EXPECT_EQ(table.size(), 1u);
  EXPECT_EQ(server->counters().foreign_client_refusals, 1u);
  // Client 4 itself, and client 3 on a new connection, are served as before.
  EXPECT_TRUE(raw_call(other, Op::kPush, one_row_push(12, stride), 2, 4).ok());
  Connection again = connect_as(*server, token, 3);
  EXPECT_TRUE(raw_call(again, Op::kPush, one_row_push(13, stride), 4, 3).ok());
  EXPECT_EQ(table.size(), 3u);
  EXPECT_EQ(server->counters().foreign_client_refusals, 1u);
}

TEST_P(ClientIdentity, OneClientHoldsAtMostItsShareOfHeldWritesAndAnotherStillWrites) {
  const bool token = GetParam();
  FakeHostTier table(test_config());
  auto server = start_server(&table, options_with(token));
  ASSERT_TRUE(server);
  // Client 1 starts three times the server's held writes in all: it holds its share only.
  Connection hog = connect_as(*server, token, 1);
  uint64_t id = 10;
  for (uint64_t w = 1; w <= 3 * kMaxHeldDenseWrites; ++w) {
    ASSERT_TRUE(write_half(hog, 1, w, 0, kFour, id++).ok());
    ASSERT_LE(server->counters().dense_held_writes, kMaxStagedDenseWrites);
  }
  // Another client writes in ranges and commits.
  Connection writer = connect_as(*server, token, 2);
  std::vector<uint8_t> reply;
  ASSERT_TRUE(write_half(writer, 2, 1, 4, kOtherFour, 10, &reply).ok());
  EXPECT_FALSE(dense_committed(reply, 4));
  ASSERT_TRUE(write_half(writer, 2, 1, 0, kFour, 11, &reply).ok());
  EXPECT_TRUE(dense_committed(reply, 0));
  EXPECT_EQ(read_dense(writer, 2, 12), (std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8}));
  // The slots of one host taken by clients of it on open connections (7 more trainers of this
  // host, 4 writes each: every one fits): a new client of it takes the idlest write of the clients
  // holding the most there, and the count stays at the host's limit, also for new clients
  // spreading over 127.0.0.2, 127.0.0.3, ...: every loopback address is one host (share_address).
  // (The server's limit, reached by other hosts: held_write_slots_test.cpp on PsStore, and
  // server_hosts_test.cpp end to end in a network namespace, as root.)
  std::vector<Connection> fillers;
  hold_writes(*server, token, "127.0.0.1", 100, kMaxStagedDenseWrites, kMaxHeldDenseWritesPerHost,
              &fillers);
  EXPECT_EQ(fillers.size(), kMaxHeldDenseWritesPerHost / kMaxStagedDenseWrites - 1);
  write_commits(*server, token, "127.0.0.1", 999);
  EXPECT_EQ(server->counters().dense_held_writes, kMaxHeldDenseWritesPerHost - 1);
  hold_writes(*server, token, "127.0.0.1", 300, 1, kMaxHeldDenseWritesPerHost, &fillers);
  for (uint64_t spread = 2; spread < 6; ++spread) {
    const std::string source = "127.0.0." + std::to_string(spread);
    fillers.push_back(connect_as(*server, token, 200 + spread, source.c_str()));
    const Status st = write_half(fillers.back(), 200 + spread, 1, 0, kFour, 10);
    ASSERT_TRUE(st.ok()) << source << ": " << st.to_string();
    ASSERT_EQ(server->counters().dense_held_writes, kMaxHeldDenseWritesPerHost) << source;
  }
  write_commits(*server, token, "127.0.0.6", 998);
  EXPECT_EQ(server->counters().dense_held_writes, kMaxHeldDenseWritesPerHost - 1);
  // The hog's oldest held write went first (at the host's limit, the slowest of the greediest
  // client's, all as slow, the oldest first): its last range is refused naming why; then the hog
  // held 3, fewer than the fillers holding 4, whose writes went to the newer clients: its next
  // write was kept, and its last range commits.
  const uint64_t oldest = 3 * kMaxHeldDenseWrites - kMaxStagedDenseWrites + 1;
  const Status dropped = write_half(hog, 1, oldest, 4, kOtherFour, id++);
  EXPECT_EQ(dropped.code(), Status::Code::kNotFound) << dropped.to_string();
  EXPECT_NE(dropped.message().find("write " + std::to_string(oldest) +
                                   " was dropped: its slot went to a write of another client"),
            std::string::npos)
      << dropped.to_string();
  std::vector<uint8_t> last;
  ASSERT_TRUE(write_half(hog, 1, oldest + 1, 4, kOtherFour, id++, &last).ok());
  EXPECT_TRUE(dense_committed(last, 4));
}

TEST_P(ClientIdentity, AForgedIdCannotEvictAnotherClientsHeldWrite) {
  const bool token = GetParam();
  FakeHostTier table(test_config());
  auto server = start_server(&table, options_with(token));
  ASSERT_TRUE(server);
  Connection victim = connect_as(*server, token, 7);
  ASSERT_TRUE(write_half(victim, 7, 1, 0, kFour, 2).ok());
  // Client 8 sends ranged writes in client 7's name (which would drop 7's oldest beyond its
  // share): the first is refused and the connection closed.
  Connection forger = connect_as(*server, token, 8);
  const Status st = write_half(forger, 7, 50, 0, kFour, 3);
  EXPECT_EQ(st.code(), Status::Code::kPermissionDenied) << st.to_string();
  EXPECT_NE(st.message().find("carries client id 7"), std::string::npos) << st.to_string();
  EXPECT_TRUE(closed_by_peer(forger.fd(), 3.0));
  // In its own name, however many writes, it drops only its own.
  Connection own = connect_as(*server, token, 8);
  for (uint64_t w = 1; w <= 3 * kMaxStagedDenseWrites; ++w) {
    ASSERT_TRUE(
        raw_dense(own, dense_range(DenseAction::kWrite, 8, 0, 4, w), &kFour, 10 + w, nullptr, 8)
            .ok());
  }
  std::vector<uint8_t> reply;
  ASSERT_TRUE(write_half(victim, 7, 1, 4, kOtherFour, 4, &reply).ok());
  EXPECT_TRUE(dense_committed(reply, 4));  // client 7's write was held throughout
  EXPECT_EQ(read_dense(victim, 7, 5), (std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8}));
}

// One client id on two live connections (two threads of one trainer): both of its writes of one
// table are held side by side and commit, neither released for the other.
TEST_P(ClientIdentity, OneClientWritesOneTableOverTwoLiveConnections) {
  const bool token = GetParam();
  FakeHostTier table(test_config());
  auto server = start_server(&table, options_with(token));
  ASSERT_TRUE(server);
  Connection first = connect_as(*server, token, 5);
  Connection second = connect_as(*server, token, 5);
  std::vector<uint8_t> reply;
  ASSERT_TRUE(write_half(first, 5, 1, 0, kFour, 2).ok());
  ASSERT_TRUE(write_half(second, 5, 2, 0, kOtherFour, 3).ok());
  EXPECT_EQ(server->counters().dense_held_writes, 2u);
  ASSERT_TRUE(write_half(first, 5, 1, 4, kFour, 4, &reply).ok());
  EXPECT_TRUE(dense_committed(reply, 4));
  EXPECT_EQ(read_dense(second, 5, 5), (std::vector<float>{1, 2, 3, 4, 1, 2, 3, 4}));
  ASSERT_TRUE(write_half(second, 5, 2, 4, kOtherFour, 6, &reply).ok());
  EXPECT_TRUE(dense_committed(reply, 4));
  EXPECT_EQ(read_dense(first, 5, 7), (std::vector<float>{5, 6, 7, 8, 5, 6, 7, 8}));
  EXPECT_EQ(server->counters().foreign_client_refusals, 0u);
}

INSTANTIATE_TEST_SUITE_P(TokenOrNot, ClientIdentity, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "WithToken" : "WithoutToken";
                         });

// The real client, one id from two threads (each call on connections of its own from the
// client's pool): every ranged write of the one table commits.
TEST(ClientIdentityClient, TwoThreadsOfOneClientWriteOneTableInRanges) {
  FakeHostTier table(test_config());
  ServerOptions so;
  so.max_payload_bytes = 4096;  // a table of 3000 values travels in ranges
  so.auth_token = kTestToken;
  auto server = start_server(&table, so);
  ASSERT_TRUE(server);
  RemoteHostTierOptions o = client_options(server->endpoint());
  o.client_id = 5;
  o.auth_token = kTestToken;
  auto client = connect_client(o);
  ASSERT_TRUE(client);
  constexpr std::size_t kValues = 3000;
  std::vector<Status> results(2);
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 4 && results[t].ok(); ++round) {
        std::vector<float> values(kValues, static_cast<float>(t + 1));
        results[t] = client->dense(DenseAction::kWrite, "shared", &values);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (const Status& st : results) EXPECT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(server->counters().foreign_client_refusals, 0u);
  EXPECT_EQ(server->counters().dense_held_writes, 0u);
  std::vector<float> read(kValues, 0.0f);
  ASSERT_TRUE(client->dense(DenseAction::kRead, "shared", &read).ok());
  EXPECT_TRUE(read == std::vector<float>(kValues, 1.0f) ||
              read == std::vector<float>(kValues, 2.0f));
}

// Issue 32: a rewrite retried after its connection was lost needed room for the stale write too
// (4 times the table: table, stale write, new write, commit copy) until the stale one expired.
// Once every connection that carried it closed, the same client's new write of that table
// releases it at once; while one is open it is never released, and another client's never.
TEST(ClientIdentityRewrite, ARewriteReleasesTheSameClientsAbandonedWriteOfTheTable) {
  FakeHostTier table(test_config());
  ServerOptions so;
  so.max_dense_bytes = 3 * 8 * sizeof(float) + 16;  // the table, a held write, its copy
  auto server = start_server(&table, so);
  ASSERT_TRUE(server);
  Connection lost = connect_as(*server, false, 5);
  std::vector<float> eight(8, 9.0f);
  ASSERT_TRUE(raw_dense(lost, dense_range(DenseAction::kWrite, 8, 0, 8), &eight, 2, nullptr, 5)
                  .ok());  // the table, whole
  ASSERT_TRUE(write_half(lost, 5, 1, 0, kFour, 3).ok());
  // Its connection still open: the write is not released, and the rewrite does not fit.
  Connection retry = connect_as(*server, false, 5);
  Status st = write_half(retry, 5, 2, 0, kOtherFour, 2);
  EXPECT_EQ(st.code(), Status::Code::kResourceExhausted) << st.to_string();
  EXPECT_EQ(server->counters().dense_held_writes, 1u);
  // The connection is lost: the same client's rewrite of the table releases the stale write.
  lost.close();
  ASSERT_TRUE(eventually([&] { return server->counters().open_connections == 1; }));
  std::vector<uint8_t> reply;
  st = write_half(retry, 5, 2, 0, kOtherFour, 3);
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(server->counters().dense_held_writes, 1u);
  ASSERT_TRUE(write_half(retry, 5, 2, 4, kFour, 4, &reply).ok());
  EXPECT_TRUE(dense_committed(reply, 4));
  EXPECT_EQ(read_dense(retry, 5, 5), (std::vector<float>{5, 6, 7, 8, 1, 2, 3, 4}));
  // Another client's abandoned write of the table stays (until dense_write_max_idle_s).
  Connection other = connect_as(*server, false, 6);
  ASSERT_TRUE(write_half(other, 6, 1, 0, kFour, 2).ok());
  other.close();
  ASSERT_TRUE(eventually([&] { return server->counters().open_connections == 1; }));
  st = write_half(retry, 5, 3, 0, kFour, 6);
  EXPECT_EQ(st.code(), Status::Code::kResourceExhausted) << st.to_string();
  EXPECT_EQ(server->counters().dense_held_writes, 1u);
}

// A range whose reply was lost, sent again on another connection of the same client and answered
// from the retry cache: that connection carries the write from then on, so once the first one
// closes, the client's next write of the table does not take the live write for abandoned.
TEST(ClientIdentityRewrite, ARangeRetriedOnAnotherConnectionKeepsItsWriteLive) {
  FakeHostTier table(test_config());
  auto server = start_server(&table, ServerOptions{});
  ASSERT_TRUE(server);
  Connection first = connect_as(*server, false, 7);
  Connection second = connect_as(*server, false, 7);
  std::vector<float> eight(8, 9.0f);
  ASSERT_TRUE(
      raw_dense(second, dense_range(DenseAction::kWrite, 8, 0, 8), &eight, 2, nullptr, 7).ok());
  ASSERT_TRUE(write_half(first, 7, 1, 0, kFour, 3).ok());
  ASSERT_TRUE(write_half(second, 7, 1, 0, kFour, 3).ok());
  EXPECT_EQ(server->counters().duplicate_requests, 1u);
  first.close();
  ASSERT_TRUE(eventually([&] { return server->counters().open_connections == 1; }));
  ASSERT_TRUE(write_half(second, 7, 2, 0, kOtherFour, 4).ok());
  EXPECT_EQ(server->counters().dense_held_writes, 2u);
  std::vector<uint8_t> reply;
  ASSERT_TRUE(write_half(second, 7, 1, 4, kFour, 5, &reply).ok());
  EXPECT_TRUE(dense_committed(reply, 4));
  EXPECT_EQ(read_dense(second, 7, 6), (std::vector<float>{1, 2, 3, 4, 1, 2, 3, 4}));
}

// ---- the retry cache, per client ---------------------------------------------------------------

RequestKey key_of(uint64_t client, uint64_t request) {
  return RequestKey{client, request, static_cast<uint16_t>(Op::kPush), request * 31};
}

// In a full cache a client beyond its share forgets its own oldest replies, never another
// client's (an oracle of what each client should still have), also after thousands of its own
// evictions; below the bound it keeps all of them (a PS trainer's threads share one id).
TEST(ClientIdentityRetryCache, AClientBeyondItsShareForgetsItsOwnOldestOnly) {
  const std::size_t per = RequestWindow::kEntryOverheadBytes + 1;
  const std::size_t clients = 2 * RequestWindow::kClientOverheadBytes;
  RequestWindow window(clients + 100 * per, std::chrono::hours(1), 10 * per);
  const auto t = RequestWindow::Clock::now();
  CachedReply reply;
  reply.payload = {7};
  const auto finish = [&](uint64_t client, uint64_t request) {
    ASSERT_EQ(window.begin(key_of(client, request), t, &reply), RequestWindow::Begin::kNew);
    window.finish(key_of(client, request), t, reply, true);
  };
  for (uint64_t r = 1; r <= 5; ++r) finish(2, r);
  for (uint64_t r = 1; r <= 50; ++r) finish(1, r);  // within the bound: all kept
  EXPECT_EQ(window.client_bytes(1), 50 * per);
  constexpr uint64_t kFlood = 5000;
  for (uint64_t r = 51; r <= kFlood; ++r) finish(1, r);
  EXPECT_EQ(window.client_bytes(1), 95 * per);
  EXPECT_EQ(window.client_bytes(2), 5 * per);
  EXPECT_EQ(window.bytes(), clients + 100 * per);
  EXPECT_EQ(window.entries(), 100u);
  for (uint64_t r = 1; r <= 5; ++r) {
    EXPECT_EQ(window.begin(key_of(2, r), t, &reply), RequestWindow::Begin::kDone) << r;
  }
  for (uint64_t r = kFlood - 94; r <= kFlood; ++r) {
    EXPECT_EQ(window.begin(key_of(1, r), t, &reply), RequestWindow::Begin::kDone) << r;
  }
  EXPECT_EQ(window.begin(key_of(1, kFlood - 95), t, &reply), RequestWindow::Begin::kNew);
  // Age still forgets everything, the stale records of the evictions included.
  window.finish(key_of(1, kFlood - 95), t, reply, false);
  EXPECT_EQ(window.begin(key_of(3, 1), t + std::chrono::hours(2), &reply),
            RequestWindow::Begin::kNew);
  EXPECT_EQ(window.bytes(), 0u);
  EXPECT_EQ(window.entries(), 1u);  // the one just begun
}

// End to end: a client flooding PUSHes does not make another client's retried PUSH apply twice.
TEST(ClientIdentityRetryCache, AFloodingClientDoesNotPushOutAnothersRememberedReply) {
  FakeHostTier table(test_config());
  ServerOptions so;
  so.dedup_max_bytes = 100 * RequestWindow::kEntryOverheadBytes;  // a client's share: an eighth
  auto server = start_server(&table, so);
  ASSERT_TRUE(server);
  const uint32_t stride = static_cast<uint32_t>(table.layout().stride());
  Connection victim = connect_as(*server, false, 2);
  ASSERT_TRUE(raw_call(victim, Op::kPush, one_row_push(1, stride), 5, 2).ok());
  Connection flood = connect_as(*server, false, 1);
  for (uint64_t r = 1; r <= 1000; ++r) {
    ASSERT_TRUE(raw_call(flood, Op::kPush, one_row_push(1, stride), 100 + r, 1).ok());
  }
  EXPECT_LE(server->counters().dedup_bytes, so.dedup_max_bytes);
  const uint64_t pushes = table.push_calls.load();
  ASSERT_TRUE(raw_call(victim, Op::kPush, one_row_push(1, stride), 5, 2).ok());  // a retry
  EXPECT_EQ(table.push_calls.load(), pushes);
  EXPECT_EQ(server->counters().duplicate_requests, 1u);
}

}  // namespace
}  // namespace gpubox::table::server
