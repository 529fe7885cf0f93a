// gpubox_server under abuse, in-process on loopback (issue #12, items 1-3): connection caps and
// idle timeouts, barrier waiters that leave, memory before authentication and in flight, and
// refused frames logged with their peer. What the server keeps and where it writes (the retry
// cache, data_dir, the token, non-finite rows, restarts): server_state_test.cpp.
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <cstring>
#include <string>
#include <thread>

#include "common/logging.hpp"
#include "tests/table/server/fake_host_tier.hpp"
#include "tests/table/server/server_test_util.hpp"

namespace gpubox::table::server {
namespace {

using namespace testing;  // NOLINT: FakeHostTier and the loopback helpers

// Sends a header announcing `payload_bytes` of `op` and then `sent` bytes of payload.
void send_partial_frame(Connection& conn, Op op, uint32_t payload_bytes, std::size_t sent) {
  FrameHeader h;
  h.op = op;
  h.payload_bytes = payload_bytes;
  std::vector<uint8_t> bytes(kHeaderBytes + sent, 0x5a);
  encode_header(h, bytes.data());
  ASSERT_TRUE(conn.send_all(bytes.data(), bytes.size(), seconds_from_now(2)).ok());
}
// ---- 1. connections: cap, idle timeout --------------------------------------------------------

TEST(Hardening, ConnectionsOverTheCapAreClosedAtOnce) {
  FakeHostTier table(test_config());
  ServerOptions so;
  so.max_connections = 3;
  auto server = start_server(&table, so);
  ASSERT_TRUE(server);
  EXPECT_EQ(server->max_connections(), 3u);
  // Three clients of one connection each, just used: none holds more than a new client's share
  // (server_cap_share_test.cpp: what a client holding more gives).
  std::vector<Connection> held;
  for (uint64_t id = 1; id <= 3; ++id) held.push_back(connect_as(*server, false, id));
  ASSERT_TRUE(eventually([&] { return server->counters().open_connections == 3; }));
  for (int i = 0; i < 2; ++i) {
    Connection extra = raw_connection(server->port());
    EXPECT_TRUE(closed_by_peer(extra.fd(), 2.0)) << "connection over the cap " << i;
  }
  EXPECT_EQ(server->counters().refused_connections, 2u);
  for (uint64_t id = 1; id <= 3; ++id) {
    EXPECT_TRUE(raw_call(held[id - 1], Op::kStats, {}, 2, id).ok());  // still served
  }
  held.pop_back();
  ASSERT_TRUE(eventually([&] { return server->counters().open_connections == 2; }));
  Connection next = raw_connection(server->port());
  EXPECT_TRUE(raw_call(next, Op::kStats, {}).ok());
}

TEST(Hardening, IdleConnectionsAreClosedAndClientsReconnect) {
  FakeHostTier table(test_config());
  ServerOptions so;
  // The idle clock starts at accept: longer than the frame deadline, so that the stalled
  // connection's partial frame arrives before it is idle, on a loaded machine too.
  so.idle_timeout_s = 1.0;
  so.frame_deadline_s = 0.2;
  auto server = start_server(&table, so);
  ASSERT_TRUE(server);
  auto client = connect_client(client_options(server->endpoint()));
  ASSERT_TRUE(client);
  Connection silent = raw_connection(server->port());
  Connection stalled = raw_connection(server->port());
  send_partial_frame(stalled, Op::kPush, 1000, 10);  // a frame that never completes
  EXPECT_TRUE(closed_by_peer(silent.fd(), 10.0));
  EXPECT_TRUE(closed_by_peer(stalled.fd(), 10.0));
  EXPECT_GE(server->counters().idle_closed, 1u);      // the silent one (and the client's)
  EXPECT_GE(server->counters().deadline_closed, 1u);  // the stalled frame
  // The client's pooled connections were closed too: its next calls reconnect transparently.
  ASSERT_TRUE(eventually([&] { return server->counters().open_connections == 0; }));
  std::vector<uint64_t> keys{1, 2, 3};
  std::vector<float> rows(keys.size() * client->layout().stride());
  Status st = client->pull(keys.data(), nullptr, keys.size(), rows.data(), nullptr);
  EXPECT_TRUE(st.ok()) << st.to_string();
}

// A connection that keeps talking is not idle: calls back to back over two idle timeouts and
// three sweeps. The timeout is 1 s, not 0.2 s: a thread descheduled on a loaded machine could
// pause 0.2 s between two calls, and then the server would rightly close the connection.
TEST(Hardening, AConnectionThatKeepsTalkingIsNotIdle) {
  FakeHostTier table(test_config());
  ServerOptions so;
  so.idle_timeout_s = 1.0;
  auto server = start_server(&table, so);
  ASSERT_TRUE(server);
  Connection busy = raw_connection(server->port());
  const auto talked_from = Clock::now();
  const auto give_up = talked_from + std::chrono::seconds(30);
  const uint64_t sweeps = server->counters().sweeps;
  for (int i = 0; Clock::now() - talked_from < std::chrono::seconds(2) ||
                  server->counters().sweeps < sweeps + 3;
       ++i) {
    ASSERT_TRUE(raw_call(busy, Op::kStats, {}).ok()) << "call " << i;
    if (Clock::now() >= give_up) {
      ADD_FAILURE() << "the server swept " << server->counters().sweeps - sweeps
                    << " time(s) in 30 s, not 3";
      break;
    }
  }
  EXPECT_EQ(server->counters().idle_closed, 0u);
}

// ---- 2. barrier waiters that leave -----------------------------------------------------------

std::vector<uint8_t> barrier_frame(const std::string& name, uint32_t parties, uint64_t id = 1) {
  std::vector<uint8_t> p;
  encode_barrier_request(name, parties, &p);
  FrameHeader h;
  h.op = Op::kBarrier;
  h.request_id = id;
  return encode_frame(h, p);
}

TEST(Hardening, BarrierWaitersThatLeaveAreFreedAndNeverCounted) {
  FakeHostTier table(test_config());
  auto server = start_server(&table);
  ASSERT_TRUE(server);
  const auto baseline = server->counters().open_connections;
  // 50 clients wait on a barrier and leave: their connections are freed.
  {
    std::vector<Connection> leavers;
    for (int i = 0; i < 50; ++i) {
      leavers.push_back(raw_connection(server->port()));
      const auto frame = barrier_frame("crowd", 1000);
      ASSERT_TRUE(leavers.back().send_all(frame.data(), frame.size(), seconds_from_now(2)).ok());
    }
    ASSERT_TRUE(eventually([&] { return server->counters().requests >= 50; }));
  }
  EXPECT_TRUE(eventually([&] { return server->counters().open_connections == baseline; }))
      << server->counters().open_connections << " connections still open";
  EXPECT_GE(server->counters().barrier_waiters_dropped, 50u);

  // A party that left does not count: a lone new party waits for a real second one.
  for (int round = 0; round < 10; ++round) {
    const std::string name = "pair-" + std::to_string(round);
    const uint64_t before = server->counters().requests;
    {
      Connection gone = raw_connection(server->port());
      const auto frame = barrier_frame(name, 2);
      ASSERT_TRUE(gone.send_all(frame.data(), frame.size(), seconds_from_now(2)).ok());
      ASSERT_TRUE(eventually([&] { return server->counters().requests > before; }));
    }  // closed: the server may not have noticed yet when the next party arrives
    Connection lone = raw_connection(server->port());
    const auto frame = barrier_frame(name, 2, 2);
    ASSERT_TRUE(lone.send_all(frame.data(), frame.size(), seconds_from_now(2)).ok());
    EXPECT_FALSE(readable_within(lone.fd(), 0.1)) << "released with a party that left, " << name;
    Connection second = raw_connection(server->port());
    ASSERT_TRUE(second.send_all(frame.data(), frame.size(), seconds_from_now(2)).ok());
    Frame reply;
    ASSERT_TRUE(lone.recv_frame(&reply, kDefaultMaxPayloadBytes, seconds_from_now(2)).ok());
    EXPECT_EQ(reply.header.status, Status::Code::kOk);
    ASSERT_TRUE(second.recv_frame(&reply, kDefaultMaxPayloadBytes, seconds_from_now(2)).ok());
  }
}

TEST(Hardening, BarrierWaitersAreNotIdle) {
  FakeHostTier table(test_config());
  ServerOptions so;
  so.idle_timeout_s = 0.1;
  auto server = start_server(&table, so);
  ASSERT_TRUE(server);
  auto a = connect_client(client_options(server->endpoint()));
  auto b = connect_client(client_options(server->endpoint()));
  ASSERT_TRUE(a && b);
  Status first;
  std::thread waiter([&] { first = a->barrier("slow", 2, 3.0); });
  ASSERT_TRUE(eventually([&] { return server->counters().barrier_waiters == 1; }));
  // Five idle timeouts waiting (what is tested), then two sweeps, so that one began after them
  // however late the machine runs the server's sweeps.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const uint64_t sweeps = server->counters().sweeps;
  ASSERT_TRUE(eventually([&] { return server->counters().sweeps >= sweeps + 2; }));
  EXPECT_TRUE(b->barrier("slow", 2, 3.0).ok());
  waiter.join();
  EXPECT_TRUE(first.ok()) << first.to_string();
}

// ---- 3. memory before authentication and in flight -------------------------------------------

TEST(Hardening, UnauthenticatedConnectionsMayOnlySendASmallAuth) {
  FakeHostTier table(test_config());
  ServerOptions so;
  so.auth_token = kTestToken;
  so.idle_timeout_s = 0;  // a refused connection is closed anyway (after a short linger)
  auto server = start_server(&table, so);
  ASSERT_TRUE(server);
  const std::size_t rss_before = resident_bytes();
  std::vector<Connection> conns;
  for (int i = 0; i < 16; ++i) {
    conns.push_back(raw_connection(server->port()));
    // A PUSH announcing 64 MiB, or an AUTH announcing 1 MiB: refused from the header alone.
    send_partial_frame(conns.back(), i % 2 ? Op::kPush : Op::kAuth,
                       i % 2 ? kDefaultMaxPayloadBytes : (1u << 20), 100);
  }
  for (auto& c : conns) {
    Frame reply;
    ASSERT_TRUE(c.recv_frame(&reply, kDefaultMaxPayloadBytes, seconds_from_now(2)).ok());
    EXPECT_EQ(reply.header.status, Status::Code::kPermissionDenied);
    EXPECT_TRUE(closed_by_peer(c.fd(), 5.0));
  }
  EXPECT_EQ(server->counters().auth_refusals, 16u);
  EXPECT_EQ(server->counters().inflight_bytes, 0u);
  EXPECT_LT(resident_bytes(), rss_before + (64u << 20));
  // The right proof in a small AUTH_PROOF still opens the door.
  Connection ok = raw_connection(server->port());
  EXPECT_TRUE(raw_authenticate(ok, kTestToken).ok());
  EXPECT_TRUE(raw_call(ok, Op::kStats, {}).ok());
}

TEST(Hardening, PayloadBuffersGrowAsBytesArrive) {
  FakeHostTier table(test_config());
  auto server = start_server(&table);  // no token: every connection may send frames
  ASSERT_TRUE(server);
  const std::size_t rss_before = resident_bytes();
  std::vector<Connection> conns;
  for (int i = 0; i < 16; ++i) {  // headers alone cost nothing
    conns.push_back(raw_connection(server->port()));
    send_partial_frame(conns.back(), Op::kPush, kDefaultMaxPayloadBytes, 0);
  }
  ASSERT_TRUE(eventually([&] {
    return server->counters().requests == 0 && server->counters().open_connections == 16;
  }));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(server->counters().inflight_bytes, 0u);
  for (auto& c : conns) {
    std::vector<uint8_t> some(1000, 0x5a);
    ASSERT_TRUE(c.send_all(some.data(), some.size(), seconds_from_now(2)).ok());
  }
  // Each holds the first 256 KiB step at most, not the 64 MiB it announced (1 GiB in all).
  ASSERT_TRUE(eventually([&] { return server->counters().inflight_bytes >= 16 * 1000; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_LE(server->counters().inflight_bytes, 16u * 256 * 1024);
  EXPECT_LT(resident_bytes(), rss_before + (128u << 20));
  conns.clear();
  EXPECT_TRUE(eventually([&] { return server->counters().inflight_bytes == 0; }));
}

TEST(Hardening, OverTheInflightBudgetRequestsAreRetriedLater) {
  FakeHostTier table(test_config());
  ServerOptions so;
  so.max_inflight_bytes = 256 * 1024;
  auto server = start_server(&table, so);
  ASSERT_TRUE(server);
  auto client = connect_client(client_options(server->endpoint()));
  ASSERT_TRUE(client);
  // A stalled frame holds 200 KiB of the 256 KiB budget.
  Connection hog = raw_connection(server->port());
  send_partial_frame(hog, Op::kPush, 200 * 1024, 150 * 1024);
  ASSERT_TRUE(eventually([&] { return server->counters().inflight_bytes >= 150 * 1024; }));
  // The hog leaves once the big chunk was refused (a condition: a loaded machine may take longer
  // than any fixed wait to send it).
  std::thread release([&] {
    EXPECT_TRUE(eventually([&] { return server->counters().budget_refusals >= 1; }, 10.0));
    hog.close();
  });
  // 1000 rows in one chunk (about 84 KiB): refused "retry later" until the hog leaves.
  auto options = client_options(server->endpoint());
  options.chunk_rows = 1000;
  options.connections_per_endpoint = 1;
  auto big = connect_client(options);
  ASSERT_TRUE(big);
  std::vector<uint64_t> keys(1000);
  std::vector<float> rows(keys.size() * big->layout().stride(), 0.5f);
  for (std::size_t i = 0; i < keys.size(); ++i) keys[i] = 1 + i;
  Status st = big->push(keys.data(), keys.size(), rows.data());
  release.join();
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_GE(server->counters().budget_refusals, 1u);
  EXPECT_EQ(table.size(), keys.size());
  EXPECT_EQ(table.push_calls.load(), 1u);
  EXPECT_TRUE(eventually([&] { return server->counters().inflight_bytes == 0; }));
}

TEST(Hardening, ConnectionBufferLimitBoundsFramesAndReplies) {
  FakeHostTier table(test_config());
  ServerOptions so;
  so.max_connection_buffer_bytes = 16 * 1024;
  auto server = start_server(&table, so);
  ASSERT_TRUE(server);
  auto options = client_options(server->endpoint());
  options.chunk_rows = 100000;  // lowered at connect to what one connection may buffer
  auto client = connect_client(options);
  ASSERT_TRUE(client);
  std::vector<uint64_t> keys(2000);
  for (std::size_t i = 0; i < keys.size(); ++i) keys[i] = 7 + i;
  std::vector<float> rows(keys.size() * client->layout().stride());
  Status st = client->pull(keys.data(), nullptr, keys.size(), rows.data(), nullptr);
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(table.size(), keys.size());
  // A frame over the limit is refused from its header.
  Connection raw = raw_connection(server->port());
  send_partial_frame(raw, Op::kPush, 20 * 1024, 0);
  EXPECT_TRUE(closed_by_peer(raw.fd(), 2.0));
  // A PULL whose reply would not fit is an error, not a retry.
  std::vector<uint8_t> pull;
  std::vector<uint64_t> many(1000, 5);
  encode_pull_request(many.data(), nullptr, many.size(), &pull);
  Connection raw2 = raw_connection(server->port());
  st = raw_call(raw2, Op::kPull, pull);
  EXPECT_EQ(st.code(), Status::Code::kResourceExhausted) << st.to_string();
  // ... naming what it holds: the reply and the request together, not the reply alone.
  const std::string reply_bytes =
      std::to_string(pull_reply_bytes(many.size(), client->layout().stride()));
  EXPECT_NE(st.message().find("a reply of " + reply_bytes + " bytes with the request's " +
                              std::to_string(pull.size()) + " bytes still held"),
            std::string::npos)
      << st.to_string();
}

// ---- rejected frames are logged with their peer -----------------------------------------------

// The lines of `log` that contain `what`.
std::size_t lines_with(const std::string& log, const std::string& what) {
  std::size_t count = 0;
  for (std::size_t at = log.find(what); at != std::string::npos; at = log.find(what, at + 1)) {
    ++count;
  }
  return count;
}

// A request the server refuses (a PUSH payload that does not decode) is logged naming the op,
// the request, the client, the connection's peer and why, not only answered; a burst of them
// (a hostile client) gives one line per interval, with a count of the lines held back. A frame
// refused from its header (another protocol version) is logged with its peer too.
TEST(Hardening, RefusedFramesAreLoggedWithThePeerAndRateLimited) {
  const LogLevel level = log_level();
  set_log_level(LogLevel::WARNING);
  FakeHostTier table(test_config());
  auto server = start_server(&table);
  ASSERT_TRUE(server);
  Connection conn = raw_connection(server->port());
  const std::vector<uint8_t> garbage(10, 0xff);
  ::testing::internal::CaptureStderr();
  constexpr int kBurst = 40;
  const auto burst_began = Clock::now();
  for (int i = 0; i < kBurst; ++i) {
    const Status st = raw_call(conn, Op::kPush, garbage, /*request_id=*/100 + i, /*client_id=*/7);
    EXPECT_EQ(st.code(), Status::Code::kCorruption) << st.to_string();
  }
  // A line per 2 s interval begun: a loaded machine, slower through the burst, may log more.
  const auto intervals = static_cast<std::size_t>(
      std::chrono::duration<double>(Clock::now() - burst_began).count() / 2.0 + 1);
  std::string log = ::testing::internal::GetCapturedStderr();
  const std::string peer = "from 127.0.0.1:";
  EXPECT_NE(log.find("refused PUSH request 100 of client 7 " + peer), std::string::npos) << log;
  EXPECT_NE(log.find("Corruption"), std::string::npos) << log;
  const std::size_t lines = lines_with(log, "refused PUSH request");
  EXPECT_GE(lines, 1u);
  EXPECT_LE(lines, intervals + 1) << "one line per 2 s interval, not one per refused request:\n"
                                  << log;

  // After the interval the next refusal is logged, with the count held back.
  std::this_thread::sleep_for(std::chrono::milliseconds(2100));
  ::testing::internal::CaptureStderr();
  EXPECT_FALSE(raw_call(conn, Op::kPush, garbage, 200, 7).ok());
  log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("refused PUSH request 200 of client 7 " + peer), std::string::npos) << log;
  if (lines < static_cast<std::size_t>(kBurst)) {
    EXPECT_NE(log.find("similar lines held back"), std::string::npos) << log;
  }

  // Another protocol version: refused from the header (answered in that version, see
  // server_deadlines_test), the connection closed, the peer named.
  FrameHeader h;
  h.op = Op::kStats;
  std::vector<uint8_t> frame(kHeaderBytes);
  encode_header(h, frame.data());
  const uint16_t version = kProtocolVersion + 1;
  std::memcpy(frame.data() + 4, &version, sizeof(version));
  ::testing::internal::CaptureStderr();
  EXPECT_TRUE(server_closes_after(server->port(), frame));
  log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("refusing connection " + peer), std::string::npos) << log;
  EXPECT_NE(log.find("unsupported protocol version " + std::to_string(version)), std::string::npos)
      << log;
  set_log_level(level);
}

}  // namespace
}  // namespace gpubox::table::server
