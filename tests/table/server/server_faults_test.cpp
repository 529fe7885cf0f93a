// What a client of gpubox_server meets when something goes wrong, in-process on loopback:
// garbage, oversized, truncated and fuzzed frames (only that connection is closed, service goes
// on), a missing token, retried mutations applied once, a dead server or one dead endpoint of two
// (clear errors naming it after the deadline), and a restart on the same port with --load that
// loses nothing saved. Rows are checked against the oracle (server_oracle.hpp).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <random>
#include <string>
#include <vector>

#include "common/timer.hpp"
#include "table/server/remote_host_tier.hpp"
#include "table/server/server.hpp"
#include "tests/table/server/fake_host_tier.hpp"
#include "tests/table/server/server_oracle.hpp"
#include "tests/table/server/server_test_util.hpp"

namespace gpubox::table::server {
namespace {

using namespace testing;  // NOLINT: FakeHostTier, the oracle and the loopback helpers

TEST(Server, GarbageOversizedAndTruncatedFramesCloseOnlyThatConnection) {
  FakeHostTier table(test_config());
  ServerOptions so;
  so.max_payload_bytes = 1 << 20;
  auto server = start_server(&table, so);
  ASSERT_TRUE(server);
  auto client = connect_client(client_options(server->endpoint()));
  ASSERT_TRUE(client);
  Oracle oracle(test_config());
  random_ops(client.get(), 1, 1, 500, 10, &oracle);

  std::mt19937_64 rng(5);
  std::vector<uint8_t> garbage(300);
  for (auto& b : garbage) b = static_cast<uint8_t>(rng());
  EXPECT_TRUE(server_closes_after(server->port(), garbage));

  FrameHeader h;
  h.op = Op::kPush;
  h.payload_bytes = (1 << 20) + 1;  // over the limit: refused from the header alone
  std::vector<uint8_t> oversized(kHeaderBytes);
  encode_header(h, oversized.data());
  EXPECT_TRUE(server_closes_after(server->port(), oversized));

  std::vector<uint8_t> payload(100, 0);
  auto truncated = encode_frame(h, payload);
  truncated.resize(truncated.size() - 10);
  EXPECT_TRUE(server_closes_after(server->port(), truncated));

  // A well-framed PUSH whose payload lies about its count: error reply, then closed.
  std::vector<uint8_t> lying;
  PayloadWriter w(&lying);
  w.put_u32(1000);
  w.put_u32(oracle.stride());
  w.put_u64(1);
  h.payload_bytes = 0;
  auto frame = encode_frame(h, lying);
  auto conn = Connection::open(Endpoint{"127.0.0.1", server->port()},
                               Clock::now() + std::chrono::seconds(2));
  ASSERT_TRUE(conn.ok());
  ASSERT_TRUE(
      conn->send_all(frame.data(), frame.size(), Clock::now() + std::chrono::seconds(2)).ok());
  Frame reply;
  ASSERT_TRUE(
      conn->recv_frame(&reply, kDefaultMaxPayloadBytes, Clock::now() + std::chrono::seconds(2))
          .ok());
  Status st = decode_error_reply(reply.header, reply.payload.data(), reply.payload.size());
  EXPECT_EQ(st.code(), Status::Code::kCorruption) << st.to_string();
  EXPECT_NE(st.message().find("PUSH"), std::string::npos) << st.to_string();

  // The earlier client is still served, its rows intact.
  random_ops(client.get(), 2, 1, 500, 10, &oracle);
  EXPECT_EQ(table.size(), oracle.rows().size());
  EXPECT_EQ(server->counters().protocol_errors, 3u);
}

// Mutated valid frames from many connections (a fuzz loop against the live server): each is
// answered or closed, never crashes or stalls the server, and a regular client keeps working.
TEST(Server, FuzzedFramesFromManyConnectionsDoNotStopService) {
  FakeHostTier table(test_config());
  auto server = start_server(&table);
  ASSERT_TRUE(server);
  auto client = connect_client(client_options(server->endpoint()));
  ASSERT_TRUE(client);
  Oracle oracle(test_config());
  std::mt19937_64 rng(77);
  std::vector<std::vector<uint8_t>> seeds;
  {
    std::vector<uint64_t> keys{1ULL << 50, (1ULL << 50) + 1, (1ULL << 50) + 2};
    std::vector<float> rows(keys.size() * oracle.stride(), 0.5f);
    std::vector<uint8_t> p;
    FrameHeader h;
    h.op = Op::kPull;
    encode_pull_request(keys.data(), nullptr, keys.size(), &p);
    seeds.push_back(encode_frame(h, p));
    p.clear();
    h.op = Op::kPush;
    encode_push_request(keys.data(), keys.size(), rows.data(), oracle.stride(), &p);
    seeds.push_back(encode_frame(h, p));
    h.op = Op::kStats;
    seeds.push_back(encode_frame(h, {}));
  }
  int sent = 0;
  for (int i = 0; i < 60; ++i) {
    std::vector<uint8_t> bytes = seeds[rng() % seeds.size()];
    const int flips = 1 + static_cast<int>(rng() % 3);
    for (int f = 0; f < flips; ++f) bytes[rng() % bytes.size()] = static_cast<uint8_t>(rng());
    if (rng() % 3 == 0) bytes.resize(rng() % bytes.size());
    // Ops that act on the server as a whole (stop, files, barriers) are not fuzzed here.
    auto header = decode_header(bytes.data(), bytes.size(), kDefaultMaxPayloadBytes);
    if (header.ok() && header->op != Op::kPull && header->op != Op::kPush &&
        header->op != Op::kStats && header->op != Op::kErase && header->op != Op::kInfo) {
      continue;
    }
    ++sent;
    EXPECT_TRUE(server_closes_after(server->port(), bytes)) << "connection " << i;
  }
  EXPECT_GT(sent, 30);
  random_ops(client.get(), 78, 1, 500, 20, &oracle);
  EXPECT_FALSE(server->stopped());
}

TEST(Server, AuthTokenRequiredFirst) {
  FakeHostTier table(test_config());
  ServerOptions so;
  so.auth_token = std::string(kTestToken) + "-s3cret";
  auto server = start_server(&table, so);
  ASSERT_TRUE(server);

  auto no_token = RemoteHostTier::connect(client_options(server->endpoint()));
  ASSERT_FALSE(no_token.ok());
  EXPECT_EQ(no_token.status().code(), Status::Code::kPermissionDenied)
      << no_token.status().to_string();
  EXPECT_NE(no_token.status().message().find("requires AUTH"), std::string::npos);
  // What to do, naming where the token comes from.
  EXPECT_NE(no_token.status().message().find(
                "the server requires a token and this client has none: give it the servers' token "
                "file (GPUBOX_AUTH_TOKEN_FILE"),
            std::string::npos)
      << no_token.status().to_string();

  auto wrong = client_options(server->endpoint());
  wrong.auth_token = std::string(kTestToken) + "-s3creT";
  auto refused = RemoteHostTier::connect(wrong);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), Status::Code::kPermissionDenied);
  EXPECT_NE(refused.status().message().find("wrong auth token"), std::string::npos);
  EXPECT_NE(refused.status().message().find("the server was started with another token than this "
                                            "client's: give the servers and the trainers one "
                                            "token file (GPUBOX_AUTH_TOKEN_FILE"),
            std::string::npos)
      << refused.status().to_string();
  EXPECT_EQ(table.pull_calls.load(), 0u);

  auto right = client_options(server->endpoint());
  right.auth_token = std::string(kTestToken) + "-s3cret";
  auto client = connect_client(right);
  ASSERT_TRUE(client);
  Oracle oracle(test_config());
  random_ops(client.get(), 3, 1, 300, 10, &oracle);
  EXPECT_EQ(server->counters().auth_refusals, 2u);
}

TEST(Server, RetriedMutationsAreAppliedOnce) {
  FakeHostTier table(test_config());
  std::atomic<int> push_drops{1}, shrink_drops{1};
  ServerOptions so;
  so.drop_reply = [&](const FrameHeader& h) {
    if (h.op == Op::kPush) return push_drops.fetch_sub(1) > 0;
    if (h.op == Op::kShrink) return shrink_drops.fetch_sub(1) > 0;
    return false;
  };
  auto server = start_server(&table, so);
  ASSERT_TRUE(server);
  auto retry_options = client_options(server->endpoint());
  retry_options.connections_per_endpoint = 1;  // one ordered stream: chunks of 64 and 36 keys
  auto client = connect_client(retry_options);
  ASSERT_TRUE(client);
  Oracle oracle(test_config());
  const std::size_t n = 100;  // two chunks of 64 and 36
  std::vector<uint64_t> keys(n);
  std::vector<float> rows(n * oracle.stride());
  for (std::size_t i = 0; i < n; ++i) keys[i] = 1000 + i;
  for (std::size_t i = 0; i < rows.size(); ++i) rows[i] = 0.25f * static_cast<float>(i % 97);
  // Every row's show is 1: after one decay 0.98 (kept), a double shrink would make it 0.9604.
  for (std::size_t i = 0; i < n; ++i) rows[i * oracle.stride() + RowLayout::kShow] = 1.0f;
  ASSERT_TRUE(client->push(keys.data(), n, rows.data()).ok());
  EXPECT_EQ(table.push_calls.load(), 2u);  // each chunk once, although one reply was lost
  EXPECT_EQ(table.pushed_rows.load(), n);
  EXPECT_GE(server->counters().duplicate_requests, 1u);

  auto deleted = client->shrink();
  ASSERT_TRUE(deleted.ok()) << deleted.status().to_string();
  EXPECT_EQ(table.shrink_calls.load(), 1u);
  std::vector<float> held;
  ASSERT_TRUE(table.row(keys[0], &held));
  EXPECT_FLOAT_EQ(held[RowLayout::kShow], 0.98f);
}

TEST(Server, DeadServerGivesClearErrorAfterDeadline) {
  FakeHostTier table(test_config());
  auto server = start_server(&table);
  ASSERT_TRUE(server);
  const std::string endpoint = server->endpoint();
  auto options = client_options(endpoint);
  options.deadline_s = 0.3;
  auto client = connect_client(options);
  ASSERT_TRUE(client);
  server.reset();  // the server is gone; the client's pooled connection is dead

  std::vector<uint64_t> keys{1, 2, 3};
  std::vector<float> rows(3 * client->layout().stride(), 1.0f);
  Timer timer;
  Status st = client->push(keys.data(), keys.size(), rows.data());
  const double took = timer.seconds();
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), Status::Code::kDeadlineExceeded) << st.to_string();
  EXPECT_NE(st.message().find("PUSH to " + endpoint), std::string::npos) << st.to_string();
  EXPECT_NE(st.message().find("gave up after"), std::string::npos) << st.to_string();
  EXPECT_NE(st.message().find("(deadline 0.3 s)"), std::string::npos) << st.to_string();
  // Retried until its deadline, and not much past it: the bound leaves a loaded machine room
  // but fails a client that retries on (its backoff is at most 0.1 s).
  EXPECT_GE(took, 0.25);
  EXPECT_LT(took, 10.0);

  // connect() to nothing: the same kind of error, for INFO.
  options.deadline_s = 0.1;
  auto none = RemoteHostTier::connect(options);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("INFO to " + endpoint), std::string::npos)
      << none.status().to_string();
}

TEST(Server, OneDeadEndpointOfTwoIsNamed) {
  FakeHostTier t0(test_config()), t1(test_config());
  ServerOptions s0, s1;
  s0.shard_num = s1.shard_num = 2;
  s1.shard_id = 1;
  auto a = start_server(&t0, s0);
  auto b = start_server(&t1, s1);
  ASSERT_TRUE(a && b);
  const std::string dead = b->endpoint();
  auto options = client_options(a->endpoint() + "," + dead);
  options.deadline_s = 0.3;
  auto client = connect_client(options);
  ASSERT_TRUE(client);
  b.reset();
  std::vector<uint64_t> keys(100);
  for (std::size_t i = 0; i < keys.size(); ++i) keys[i] = 1 + i;
  std::vector<float> rows(keys.size() * client->layout().stride());
  Status st = client->pull(keys.data(), nullptr, keys.size(), rows.data(), nullptr);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("PULL to " + dead), std::string::npos) << st.to_string();
  // The live shard answered its share.
  EXPECT_GT(t0.size(), 0u);
}

TEST(Server, RestartOnSamePortWithLoadLosesNothingSaved) {
  TempDir dir("restart");
  ServerOptions so;
  so.data_dir = dir.path().string();
  so.port = gpubox::testing::port_below_ephemeral_range();  // restarted on it below
  auto first_table = std::make_unique<FakeHostTier>(test_config());
  auto server = start_server(first_table.get(), so);
  ASSERT_TRUE(server);
  auto client = connect_client(client_options(server->endpoint()));
  ASSERT_TRUE(client);
  Oracle oracle(test_config());
  random_ops(client.get(), 11, 1, 2000, 30, &oracle);
  ASSERT_TRUE(client->save("model", SaveKind::kCheckpoint).ok());
  const auto saved = oracle.rows();

  // The server dies (its table with it) and comes back on the same port with --load.
  server.reset();
  first_table.reset();
  FakeHostTier second_table(test_config());
  auto path = load_before_start(&second_table, so, "model");
  ASSERT_TRUE(path.ok()) << path.status().to_string();
  so.loaded_model = *path;  // what --load does: INFO reports the save's generation
  server = start_server(&second_table, so);
  ASSERT_TRUE(server);

  // The same client object carries on: its stale pooled connection is replaced transparently,
  // and the new server instance is accepted because it holds this client's last save and the
  // client wrote nothing since.
  std::vector<uint64_t> keys;
  for (const auto& [key, row] : saved) keys.push_back(key);
  std::vector<float> got(keys.size() * oracle.stride());
  std::size_t created = 1;
  Status st = client->pull(keys.data(), nullptr, keys.size(), got.data(), &created);
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(created, 0u);
  for (std::size_t i = 0; i < keys.size(); ++i) {
    std::vector<float> row(got.begin() + i * oracle.stride(),
                           got.begin() + (i + 1) * oracle.stride());
    ASSERT_EQ(row, saved.at(keys[i])) << keys[i];
  }
  // And a bad path is a clear error, not a crash.
  st = client->load("../escape");
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find(".."), std::string::npos) << st.to_string();
}

}  // namespace
}  // namespace gpubox::table::server
