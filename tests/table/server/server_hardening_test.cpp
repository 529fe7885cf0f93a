// gpubox_server under abuse, in-process on loopback (issue #12, items 1-6 and 8): connection caps
// and idle timeouts, barrier waiters that leave, memory before authentication and in flight,
// the retry cache's key and bounds, paths that try to leave data_dir, non-finite rows, and
// servers that restart under a client.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <thread>

#include "common/logging.hpp"
#include "table/server/model_path.hpp"
#include "table/server/request_window.hpp"
#include "tests/table/server/fake_host_tier.hpp"
#include "tests/table/server/server_test_util.hpp"

namespace gpubox::table::server {
namespace {

using namespace testing;  // NOLINT: FakeHostTier and the loopback helpers
namespace fs = std::filesystem;

// A fresh folder under the temp dir, removed at the end of the test.
class TempDir {
 public:
  explicit TempDir(const std::string& name)
      : path_(fs::temp_directory_path() /
              ("gpubox_hardening_" + name + "_" + std::to_string(::getpid()))) {
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

std::vector<uint8_t> push_payload(const std::vector<uint64_t>& keys, const std::vector<float>& rows,
                                  uint32_t stride) {
  std::vector<uint8_t> p;
  encode_push_request(keys.data(), keys.size(), rows.data(), stride, &p);
  return p;
}

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
  std::vector<Connection> held;
  for (int i = 0; i < 3; ++i) held.push_back(raw_connection(server->port()));
  ASSERT_TRUE(eventually([&] { return server->counters().open_connections == 3; }));
  for (int i = 0; i < 2; ++i) {
    Connection extra = raw_connection(server->port());
    EXPECT_TRUE(closed_by_peer(extra.fd(), 2.0)) << "connection over the cap " << i;
  }
  EXPECT_EQ(server->counters().refused_connections, 2u);
  for (auto& c : held) EXPECT_TRUE(raw_call(c, Op::kStats, {}).ok());  // still served
  held.pop_back();
  ASSERT_TRUE(eventually([&] { return server->counters().open_connections == 2; }));
  Connection next = raw_connection(server->port());
  EXPECT_TRUE(raw_call(next, Op::kStats, {}).ok());
}

TEST(Hardening, IdleConnectionsAreClosedAndClientsReconnect) {
  FakeHostTier table(test_config());
  ServerOptions so;
  so.idle_timeout_s = 0.2;
  so.frame_deadline_s = 0.2;
  auto server = start_server(&table, so);
  ASSERT_TRUE(server);
  auto client = connect_client(client_options(server->endpoint()));
  ASSERT_TRUE(client);
  Connection silent = raw_connection(server->port());
  Connection stalled = raw_connection(server->port());
  send_partial_frame(stalled, Op::kPush, 1000, 10);  // a frame that never completes
  EXPECT_TRUE(closed_by_peer(silent.fd(), 3.0));
  EXPECT_TRUE(closed_by_peer(stalled.fd(), 3.0));
  EXPECT_GE(server->counters().idle_closed, 1u);      // the silent one (and the client's)
  EXPECT_GE(server->counters().deadline_closed, 1u);  // the stalled frame
  // The client's pooled connections were closed too: its next calls reconnect transparently.
  ASSERT_TRUE(eventually([&] { return server->counters().open_connections == 0; }));
  std::vector<uint64_t> keys{1, 2, 3};
  std::vector<float> rows(keys.size() * client->layout().stride());
  Status st = client->pull(keys.data(), nullptr, keys.size(), rows.data(), nullptr);
  EXPECT_TRUE(st.ok()) << st.to_string();
  // A connection that keeps talking is not idle.
  Connection busy = raw_connection(server->port());
  for (int i = 0; i < 6; ++i) {
    ASSERT_TRUE(raw_call(busy, Op::kStats, {}).ok()) << i;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
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
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // five idle timeouts
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
  std::thread release([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
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
  for (int i = 0; i < kBurst; ++i) {
    const Status st = raw_call(conn, Op::kPush, garbage, /*request_id=*/100 + i, /*client_id=*/7);
    EXPECT_EQ(st.code(), Status::Code::kCorruption) << st.to_string();
  }
  std::string log = ::testing::internal::GetCapturedStderr();
  const std::string peer = "from 127.0.0.1:";
  EXPECT_NE(log.find("refused PUSH request 100 of client 7 " + peer), std::string::npos) << log;
  EXPECT_NE(log.find("Corruption"), std::string::npos) << log;
  const std::size_t lines = lines_with(log, "refused PUSH request");
  EXPECT_GE(lines, 1u);
  EXPECT_LE(lines, 3u) << "one line per 2 s interval, not one per refused request:\n" << log;

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

// ---- 4. the retry cache ----------------------------------------------------------------------

TEST(Hardening, RetryCacheKeysOnOpAndPayload) {
  FakeHostTier table(test_config());
  TempDir dir("dedup");
  ServerOptions so;
  so.data_dir = dir.path().string();
  auto server = start_server(&table, so);
  ASSERT_TRUE(server);
  const uint32_t stride = static_cast<uint32_t>(table.layout().stride());
  Connection conn = raw_connection(server->port());
  const std::vector<uint64_t> keys{11, 12};
  const std::vector<float> rows(2 * stride, 0.25f);
  ASSERT_TRUE(raw_call(conn, Op::kPush, push_payload(keys, rows, stride), 9, 5).ok());
  // A SAVE that reuses the PUSH's ids is another request: it is applied.
  std::vector<uint8_t> save;
  encode_save_request(SaveKind::kBase, "m", &save);
  std::vector<uint8_t> reply;
  ASSERT_TRUE(raw_call(conn, Op::kSave, save, 9, 5, &reply).ok());
  EXPECT_TRUE(fs::exists(dir.path() / "m" / "fake-rows.bin"));
  auto generation = decode_u64_reply(reply.data(), reply.size());
  ASSERT_TRUE(generation.ok());
  EXPECT_EQ(*generation, model_generation((dir.path() / "m").string()));
  // So is a PUSH of other rows under the same ids.
  const std::vector<float> other(2 * stride, 0.75f);
  ASSERT_TRUE(raw_call(conn, Op::kPush, push_payload(keys, other, stride), 9, 5).ok());
  EXPECT_EQ(table.push_calls.load(), 2u);
  // The very same PUSH again is a retry: answered from the cache, not applied.
  ASSERT_TRUE(raw_call(conn, Op::kPush, push_payload(keys, other, stride), 9, 5).ok());
  EXPECT_EQ(table.push_calls.load(), 2u);
  EXPECT_EQ(server->counters().duplicate_requests, 1u);
}

TEST(Hardening, RetryCacheKeepsOnlySuccessesWithinItsBytes) {
  FakeHostTier table(test_config());
  ServerOptions so;
  so.dedup_max_bytes = 100 * RequestWindow::kEntryOverheadBytes;
  so.dedup_max_client_bytes = so.dedup_max_bytes;  // one client may fill it (here: the bound)
  auto server = start_server(&table, so);
  ASSERT_TRUE(server);
  const uint32_t stride = static_cast<uint32_t>(table.layout().stride());
  Connection conn = raw_connection(server->port());
  // 2000 refused requests (wrong stride) are not remembered.
  const std::vector<uint64_t> keys{1};
  const std::vector<float> bad_rows(stride + 1, 1.0f);
  for (uint64_t id = 1; id <= 2000; ++id) {
    Status st = raw_call(conn, Op::kPush, push_payload(keys, bad_rows, stride + 1), id, 3);
    ASSERT_EQ(st.code(), Status::Code::kInvalidArgument) << st.to_string();
  }
  EXPECT_EQ(server->counters().dedup_entries, 0u);
  // 1000 successful ones are remembered up to the byte bound.
  const std::vector<float> rows(stride, 1.0f);
  for (uint64_t id = 1; id <= 1000; ++id) {
    ASSERT_TRUE(raw_call(conn, Op::kPush, push_payload(keys, rows, stride), 5000 + id, 3).ok());
  }
  const auto c = server->counters();
  EXPECT_LE(c.dedup_bytes, so.dedup_max_bytes);
  EXPECT_GE(c.dedup_entries, 50u);
  EXPECT_LE(c.dedup_entries, 100u);
}

// ---- 5. paths, token, bind -------------------------------------------------------------------

TEST(Hardening, SaveAndLoadPathsStayInsideDataDir) {
  FakeHostTier table(test_config());
  TempDir dir("paths");
  const fs::path data = dir.path() / "data";
  const fs::path outside = dir.path() / "outside";
  fs::create_directories(data);
  fs::create_directories(outside / "victim.tmp");  // a save would delete a stale <path>.tmp
  fs::create_symlink(outside, data / "link");
  ServerOptions so;
  so.data_dir = data.string();
  auto server = start_server(&table, so);
  ASSERT_TRUE(server);
  auto client = connect_client(client_options(server->endpoint()));
  ASSERT_TRUE(client);
  for (const std::string& path :
       {(outside / "victim").string(), std::string("../outside/victim"), std::string("link/victim"),
        std::string("sub/../../x"), std::string("/etc/gpubox")}) {
    Status st = client->save(path, SaveKind::kBase);
    EXPECT_FALSE(st.ok()) << path;
    EXPECT_TRUE(st.code() == Status::Code::kPermissionDenied ||
                st.code() == Status::Code::kInvalidArgument)
        << st.to_string();
    EXPECT_FALSE(client->load(path).ok()) << path;
  }
  EXPECT_TRUE(fs::exists(outside / "victim.tmp"));
  EXPECT_FALSE(fs::exists(outside / "victim"));
  // Inside: relative, and absolute within data_dir.
  ASSERT_TRUE(client->save("day1", SaveKind::kBase).ok());
  EXPECT_TRUE(fs::exists(data / "day1" / "fake-rows.bin"));
  Status st = client->save((data / "day2").string(), SaveKind::kBase);
  EXPECT_TRUE(st.ok()) << st.to_string();
  EXPECT_TRUE(client->load("day1").ok());
}

TEST(Hardening, WithATokenShutdownSaveAndLoadNeedIt) {
  FakeHostTier table(test_config());
  TempDir dir("token");
  ServerOptions so;
  so.auth_token = kTestToken;
  so.data_dir = dir.path().string();
  auto server = start_server(&table, so);
  ASSERT_TRUE(server);
  std::vector<uint8_t> save;
  encode_save_request(SaveKind::kBase, "m", &save);
  std::vector<uint8_t> load;
  encode_path_request("m", &load);
  for (auto [op, payload] : {std::pair{Op::kShutdown, std::vector<uint8_t>{}},
                             std::pair{Op::kSave, save}, std::pair{Op::kLoad, load}}) {
    Connection conn = raw_connection(server->port());
    Status st = raw_call(conn, op, payload);
    EXPECT_EQ(st.code(), Status::Code::kPermissionDenied) << op_name(op) << ": " << st.to_string();
  }
  EXPECT_FALSE(server->stopped());
  EXPECT_FALSE(fs::exists(dir.path() / "m"));
  auto options = client_options(server->endpoint());
  options.auth_token = kTestToken;
  auto client = connect_client(options);
  ASSERT_TRUE(client);
  EXPECT_TRUE(client->save("m", SaveKind::kBase).ok());
  EXPECT_TRUE(client->shutdown_servers().ok());
  server->wait();
}

TEST(Hardening, WithoutATokenOnlyLoopbackMayBeBound) {
  FakeHostTier table(test_config());
  ServerOptions so;
  so.bind_address = "0.0.0.0";
  auto refused = Server::start(&table, so);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), Status::Code::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("loopback"), std::string::npos)
      << refused.status().to_string();
  so.auth_token = kTestToken;
  auto with_token = Server::start(&table, so);
  EXPECT_TRUE(with_token.ok()) << with_token.status().to_string();
  so.auth_token.clear();
  so.bind_address = "::1";
  auto v6 = Server::start(&table, so);  // loopback (where the machine has IPv6)
  if (!v6.ok()) {
    EXPECT_EQ(v6.status().code(), Status::Code::kUnavailable) << v6.status().to_string();
  }
}

// ---- 6. non-finite rows ----------------------------------------------------------------------

TEST(Hardening, NonFiniteRowsAreRefusedAndNothingOfTheRequestIsApplied) {
  FakeHostTier table(test_config());
  auto server = start_server(&table);
  ASSERT_TRUE(server);
  auto client = connect_client(client_options(server->endpoint()));
  ASSERT_TRUE(client);
  const uint32_t stride = static_cast<uint32_t>(client->layout().stride());
  std::vector<uint64_t> keys(200);
  for (std::size_t i = 0; i < keys.size(); ++i) keys[i] = 100 + i;
  std::vector<float> rows(keys.size() * stride, 0.5f);
  ASSERT_TRUE(client->push(keys.data(), keys.size(), rows.data()).ok());
  const uint64_t pushes = table.push_calls.load();
  Connection raw = raw_connection(server->port());
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    std::vector<float> next(keys.size() * stride, 1.5f);
    next[102 * stride + 4] = bad;  // key 202, field 4
    // The server refuses the whole request (one frame of 200 rows)...
    Status st = raw_call(raw, Op::kPush, push_payload(keys, next, stride));
    EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << st.to_string();
    EXPECT_NE(st.message().find("key 202"), std::string::npos) << st.to_string();
    EXPECT_NE(st.message().find("none of this request's 200 rows"), std::string::npos)
        << st.to_string();
    // ...and the client refuses the whole call (several frames) before sending any.
    st = client->push(keys.data(), keys.size(), next.data());
    EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << st.to_string();
    EXPECT_NE(st.message().find("key 202"), std::string::npos) << st.to_string();
  }
  EXPECT_EQ(table.push_calls.load(), pushes);
  std::vector<float> held;
  for (uint64_t k : keys) {
    ASSERT_TRUE(table.row(k, &held));
    EXPECT_EQ(held, std::vector<float>(stride, 0.5f)) << k;
  }
}

// ---- 8. restarts ------------------------------------------------------------------------------

// A client that pushed rows, and a server restarted on the same port with `table` (loaded from
// `loaded` when not empty).
struct RestartScene {
  FakeHostTier first{test_config()};
  FakeHostTier second{test_config()};
  std::unique_ptr<Server> server;
  std::unique_ptr<RemoteHostTier> client;
  ServerOptions options;
  std::vector<uint64_t> keys{5, 6, 7, 8};

  explicit RestartScene(const fs::path& data) {
    options.data_dir = data.string();
    server = start_server(&first, options);
    options.port = server->port();
    client = connect_client(client_options(server->endpoint()));
  }
  Status push(float value) {
    std::vector<float> rows(keys.size() * client->layout().stride(), value);
    return client->push(keys.data(), keys.size(), rows.data());
  }
  Status pull() {
    std::vector<float> rows(keys.size() * client->layout().stride());
    return client->pull(keys.data(), nullptr, keys.size(), rows.data(), nullptr);
  }
  void restart(const std::string& load_from) {
    server.reset();
    options.loaded_model.clear();
    if (!load_from.empty()) {
      auto path = load_before_start(&second, options, load_from);
      ASSERT_TRUE(path.ok()) << path.status().to_string();
      options.loaded_model = *path;
    }
    server = start_server(&second, options);
    ASSERT_TRUE(server);
  }
};

TEST(Hardening, ServerRestartedEmptyIsAnErrorNamingTheEndpoint) {
  TempDir dir("restart_empty");
  RestartScene scene(dir.path());
  ASSERT_TRUE(scene.client);
  ASSERT_TRUE(scene.push(0.5f).ok());
  const uint64_t old_instance = scene.server->instance_id();
  EXPECT_EQ(scene.client->server_identity(0).instance_id, old_instance);
  scene.restart("");
  const std::string endpoint = scene.server->endpoint();
  for (int attempt = 0; attempt < 2; ++attempt) {  // every call fails until accepted
    Status st = scene.pull();
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.code(), Status::Code::kAborted) << st.to_string();
    EXPECT_NE(st.message().find("server " + endpoint + " restarted"), std::string::npos)
        << st.to_string();
    EXPECT_NE(st.message().find("now empty"), std::string::npos) << st.to_string();
  }
  EXPECT_EQ(scene.second.size(), 0u);  // nothing was recreated silently
  auto pending = scene.client->pending_restarts();
  ASSERT_EQ(pending.size(), 1u);
  EXPECT_EQ(pending[0].where, endpoint);
  EXPECT_EQ(pending[0].before.instance_id, old_instance);
  EXPECT_EQ(pending[0].after.instance_id, scene.server->instance_id());
  EXPECT_EQ(pending[0].after.generation, 0u);
  // The trainer decides: accepted, calls proceed.
  scene.client->accept_restarts();
  EXPECT_TRUE(scene.client->pending_restarts().empty());
  EXPECT_TRUE(scene.pull().ok());
}

TEST(Hardening, ServerRestartedFromTheLastSaveIsErrorOnlyWhenRowsWereLost) {
  TempDir dir("restart_save");
  {  // saved, nothing pushed since, restarted from that save: nothing lost, carries on
    RestartScene scene(dir.path());
    ASSERT_TRUE(scene.client);
    ASSERT_TRUE(scene.push(0.5f).ok());
    ASSERT_TRUE(scene.client->save("ckpt", SaveKind::kCheckpoint).ok());
    scene.restart("ckpt");
    Status st = scene.pull();
    EXPECT_TRUE(st.ok()) << st.to_string();
    EXPECT_TRUE(scene.client->pending_restarts().empty());
  }
  {  // pushed after the save: those rows are gone
    RestartScene scene(dir.path());
    ASSERT_TRUE(scene.client);
    ASSERT_TRUE(scene.client->save("ckpt2", SaveKind::kCheckpoint).ok());
    ASSERT_TRUE(scene.push(0.75f).ok());
    scene.restart("ckpt2");
    Status st = scene.pull();
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find("now holding the save of generation"), std::string::npos)
        << st.to_string();
  }
  {  // restarted from another save than the client's last one
    RestartScene scene(dir.path());
    ASSERT_TRUE(scene.client);
    ASSERT_TRUE(scene.push(0.25f).ok());
    ASSERT_TRUE(scene.client->save("old", SaveKind::kCheckpoint).ok());
    ASSERT_TRUE(scene.push(0.5f).ok());
    ASSERT_TRUE(scene.client->save("new", SaveKind::kCheckpoint).ok());
    scene.restart("old");
    EXPECT_EQ(scene.pull().code(), Status::Code::kAborted);
  }
}

}  // namespace
}  // namespace gpubox::table::server
