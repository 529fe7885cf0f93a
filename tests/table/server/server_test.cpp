// gpubox_server and RemoteHostTier on loopback, in-process: the server runs on an ephemeral port
// over a FakeHostTier (an unordered_map), clients check every row against an oracle.
#include "table/server/server.hpp"

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <map>
#include <random>
#include <thread>
#include <unordered_map>

#include "common/hash.hpp"
#include "common/timer.hpp"
#include "table/server/remote_host_tier.hpp"
#include "tests/table/server/fake_host_tier.hpp"
#include "tests/table/server/server_test_util.hpp"
#if GPUBOX_HAVE_SPARSE_TABLE
#include "table/sparse_table.hpp"
#endif

namespace gpubox::table::server {
namespace {

using namespace testing;  // NOLINT: FakeHostTier and the loopback helpers

// Expected rows of one client's keys: what was pushed last, or init_row for a new key.
class Oracle {
 public:
  explicit Oracle(const AccessorConfig& cfg)
      : cfg_(cfg), layout_(RowLayout::make(cfg.optimizer.kind, cfg.mf_dim, cfg.storage)) {}
  const RowLayout& layout() const { return layout_; }
  std::size_t stride() const { return layout_.stride(); }

  // The rows a pull returns; records created rows. Returns how many are new.
  std::size_t pull(const std::vector<uint64_t>& keys, const std::vector<int32_t>& slots,
                   std::vector<float>* rows) {
    rows->assign(keys.size() * stride(), 0.0f);
    std::size_t created = 0;
    for (std::size_t i = 0; i < keys.size(); ++i) {
      auto it = rows_.find(keys[i]);
      if (it == rows_.end()) {
        std::vector<float> row(stride());
        init_row(row.data(), layout_, cfg_, keys[i], slots.empty() ? 0 : slots[i]);
        it = rows_.emplace(keys[i], std::move(row)).first;
        ++created;
      }
      std::copy(it->second.begin(), it->second.end(), rows->begin() + i * stride());
    }
    return created;
  }
  void push(const std::vector<uint64_t>& keys, const std::vector<float>& rows) {
    for (std::size_t i = 0; i < keys.size(); ++i) {
      rows_[keys[i]].assign(rows.begin() + i * stride(), rows.begin() + (i + 1) * stride());
    }
  }
  void erase(const std::vector<uint64_t>& keys) {
    for (uint64_t k : keys) rows_.erase(k);
  }
  const std::unordered_map<uint64_t, std::vector<float>>& rows() const { return rows_; }

 private:
  AccessorConfig cfg_;
  RowLayout layout_;
  std::unordered_map<uint64_t, std::vector<float>> rows_;
};

// Seeded random pull/push/erase through `client` on keys [base, base + range), checked against
// the oracle. Batch sizes hit 0, 1, the chunk size, one past it and several chunks.
void random_ops(RemoteHostTier* client, uint64_t seed, uint64_t base, uint64_t range, int ops,
                Oracle* oracle) {
  std::mt19937_64 rng(seed);
  const std::size_t sizes[] = {0, 1, 63, 64, 65, 200, 517};
  const std::size_t stride = oracle->stride();
  for (int op = 0; op < ops; ++op) {
    const std::size_t n = sizes[rng() % (sizeof(sizes) / sizeof(sizes[0]))];
    std::vector<uint64_t> keys(n);
    for (auto& k : keys) k = base + rng() % range;
    const int kind = static_cast<int>(rng() % 10);
    if (kind < 5) {
      std::vector<int32_t> slots;
      if (rng() % 2) {
        slots.resize(n);
        for (auto& s : slots) s = static_cast<int32_t>(rng() % 26);
      }
      std::vector<float> got(n * stride, -1.0f), want;
      // Duplicates in one batch: the first occurrence creates, the oracle matches that.
      const std::size_t want_created = oracle->pull(keys, slots, &want);
      std::size_t created = 12345;
      Status st = client->pull(keys.data(), slots.empty() ? nullptr : slots.data(), n,
                               n ? got.data() : nullptr, &created);
      ASSERT_TRUE(st.ok()) << st.to_string();
      ASSERT_EQ(created, want_created) << "op " << op;
      ASSERT_EQ(got, want) << "op " << op << " n " << n;
    } else if (kind < 9) {
      // Unique keys per push so the last write per key is well defined.
      std::sort(keys.begin(), keys.end());
      keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
      std::vector<float> rows(keys.size() * stride);
      std::uniform_real_distribution<float> value(-2.0f, 2.0f);
      for (auto& v : rows) v = value(rng);
      // A row a card pushes back was seen this pass (tables reset unseen_days on pull and push).
      for (std::size_t i = 0; i < keys.size(); ++i) rows[i * stride + RowLayout::kUnseenDays] = 0;
      Status st = client->push(keys.data(), keys.size(), rows.data());
      ASSERT_TRUE(st.ok()) << st.to_string();
      oracle->push(keys, rows);
    } else {
      Status st = client->erase(keys.data(), keys.size());
      ASSERT_TRUE(st.ok()) << st.to_string();
      oracle->erase(keys);
    }
  }
}

// Four client threads (two share one client object, two have their own) run seeded random
// pull/push/erase on disjoint key ranges through a server over `table`; every row must match.
void check_concurrent_clients(HostTier* table) {
  ServerOptions so;
  so.threads = 2;
  auto server = start_server(table, so);
  ASSERT_TRUE(server);
  EXPECT_NE(server->port(), 0);
  auto shared = connect_client(client_options(server->endpoint()));
  ASSERT_TRUE(shared);
  constexpr int kThreads = 4;
  std::vector<Oracle> oracles(kThreads, Oracle(test_config()));
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::unique_ptr<RemoteHostTier> own;
      RemoteHostTier* client = shared.get();
      if (t >= 2) {
        own = connect_client(client_options(server->endpoint()));
        client = own.get();
      }
      ASSERT_NE(client, nullptr);
      // Disjoint key ranges per thread: each oracle is exact.
      random_ops(client, 1000 + t, (static_cast<uint64_t>(t) << 40) + 1, 3000, 60, &oracles[t]);
    });
  }
  for (auto& th : threads) th.join();
  std::size_t total = 0;
  const std::size_t stride = oracles[0].stride();
  for (const auto& o : oracles) {
    total += o.rows().size();
    for (const auto& [key, row] : o.rows()) {
      std::vector<float> held(stride);
      std::size_t created = 1;
      ASSERT_TRUE(table->pull(&key, nullptr, 1, held.data(), &created).ok());
      ASSERT_EQ(created, 0u) << key;
      ASSERT_EQ(held, row) << key;
    }
  }
  auto stats = shared->stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->rows_in_memory + stats->rows_on_disk, total);
  EXPECT_EQ(server->counters().protocol_errors, 0u);
}

TEST(Server, ConcurrentClientsMatchOracle) {
  FakeHostTier table(test_config());
  check_concurrent_clients(&table);
}

#if GPUBOX_HAVE_SPARSE_TABLE
TEST(Server, ConcurrentClientsMatchOracleOnSparseTable) {
  HostTableConfig config;
  config.shards = 8;
  auto table = SparseTable::open(test_config(), config);
  ASSERT_TRUE(table.ok()) << table.status().to_string();
  check_concurrent_clients(table->get());
}
#endif

// PEEK over the wire: the rows and the unknown count of HostTier::peek on the server's table,
// spread over two endpoints, and neither server's table changes.
TEST(Server, PeekReadsRowsAndChangesNothingOnTheServers) {
  FakeHostTier t0(test_config()), t1(test_config());
  ServerOptions s0, s1;
  s0.shard_num = s1.shard_num = 2;
  s1.shard_id = 1;
  auto a = start_server(&t0, s0);
  auto b = start_server(&t1, s1);
  ASSERT_TRUE(a && b);
  auto client = connect_client(client_options(a->endpoint() + "," + b->endpoint()));
  ASSERT_TRUE(client);
  const std::size_t stride = client->layout().stride();
  std::vector<uint64_t> keys(60);
  for (std::size_t i = 0; i < keys.size(); ++i) keys[i] = 1000 + 7 * i;
  std::vector<float> pulled(30 * stride);
  ASSERT_TRUE(client->pull(keys.data(), nullptr, 30, pulled.data(), nullptr).ok());  // held
  const uint64_t held = client->stats().value().rows_in_memory;
  std::vector<int32_t> slots(keys.size(), 3);
  std::vector<float> rows(keys.size() * stride);
  std::size_t unknown = 0;
  ASSERT_TRUE(client->peek(keys.data(), slots.data(), keys.size(), rows.data(), &unknown).ok());
  EXPECT_EQ(unknown, 30u);
  EXPECT_EQ(client->stats().value().rows_in_memory, held);
  EXPECT_EQ(std::vector<float>(rows.begin(), rows.begin() + 30 * stride), pulled);
  for (std::size_t i = 30; i < keys.size(); ++i) {
    std::vector<float> want(stride);
    init_row(want.data(), client->layout(), test_config(), keys[i], 3);
    EXPECT_EQ(std::vector<float>(rows.begin() + i * stride, rows.begin() + (i + 1) * stride), want)
        << keys[i];
  }
}

TEST(Server, KeysShardOverEndpointsAndServersRefuseForeignKeys) {
  FakeHostTier t0(test_config()), t1(test_config());
  ServerOptions s0, s1;
  s0.shard_num = s1.shard_num = 2;
  s0.shard_id = 0;
  s1.shard_id = 1;
  auto a = start_server(&t0, s0);
  auto b = start_server(&t1, s1);
  ASSERT_TRUE(a && b);
  auto client = connect_client(client_options(a->endpoint() + "," + b->endpoint()));
  ASSERT_TRUE(client);
  Oracle oracle(test_config());
  random_ops(client.get(), 7, 1, 5000, 40, &oracle);
  EXPECT_EQ(t0.size() + t1.size(), oracle.rows().size());
  EXPECT_GT(t0.size(), 0u);
  EXPECT_GT(t1.size(), 0u);
  std::vector<float> row;
  for (const auto& [key, want] : oracle.rows()) {
    FakeHostTier& owner = host_shard(key, 2) == 0 ? t0 : t1;
    ASSERT_TRUE(owner.row(key, &row)) << key;
    EXPECT_EQ(row, want);
  }
  // The endpoints in the wrong order: refused at connect, naming the server.
  auto swapped = RemoteHostTier::connect(client_options(b->endpoint() + "," + a->endpoint()));
  ASSERT_FALSE(swapped.ok());
  EXPECT_NE(swapped.status().message().find("shard 1 of 2"), std::string::npos)
      << swapped.status().to_string();
  // A client that sends a foreign key directly (one endpoint) gets a clear error naming it.
  auto only_a = RemoteHostTierOptions(client_options(a->endpoint()));
  auto lone = RemoteHostTier::connect(only_a);
  ASSERT_FALSE(lone.ok());  // shard 0 of 2 listed alone
  uint64_t foreign = 1;
  while (host_shard(foreign, 2) != 1) ++foreign;
  // Speak the protocol by hand to check the server's own check.
  auto conn =
      Connection::open(Endpoint{"127.0.0.1", a->port()}, Clock::now() + std::chrono::seconds(2));
  ASSERT_TRUE(conn.ok());
  std::vector<uint8_t> payload;
  encode_pull_request(&foreign, nullptr, 1, &payload);
  FrameHeader h;
  h.op = Op::kPull;
  h.request_id = 1;
  auto frame = encode_frame(h, payload);
  ASSERT_TRUE(
      conn->send_all(frame.data(), frame.size(), Clock::now() + std::chrono::seconds(2)).ok());
  Frame reply;
  ASSERT_TRUE(
      conn->recv_frame(&reply, kDefaultMaxPayloadBytes, Clock::now() + std::chrono::seconds(2))
          .ok());
  Status st = decode_error_reply(reply.header, reply.payload.data(), reply.payload.size());
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(st.message().find("key " + std::to_string(foreign)), std::string::npos)
      << st.to_string();
}

TEST(Server, ChunksFitTheServersFrameLimitOnPooledConnections) {
  FakeHostTier table(test_config());
  ServerOptions so;
  so.max_payload_bytes = 4096;  // about 45 rows of this layout per frame
  auto server = start_server(&table, so);
  ASSERT_TRUE(server);
  auto options = client_options(server->endpoint());
  options.chunk_rows = 100000;           // lowered to the server's limit at connect
  options.connections_per_endpoint = 3;  // every call spreads its chunks over three connections
  auto client = connect_client(options);
  ASSERT_TRUE(client);
  Oracle oracle(test_config());
  random_ops(client.get(), 21, 1, 4000, 20, &oracle);
  const auto counters = server->counters();
  EXPECT_EQ(counters.protocol_errors, 0u);
  // One thread: the three connections of the first call are pooled and serve every later call;
  // a 517-key batch took several frames.
  EXPECT_EQ(counters.connections, 3u);
  EXPECT_GT(counters.requests, 20u);
}

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

  auto wrong = client_options(server->endpoint());
  wrong.auth_token = std::string(kTestToken) + "-s3creT";
  auto refused = RemoteHostTier::connect(wrong);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), Status::Code::kPermissionDenied);
  EXPECT_NE(refused.status().message().find("wrong auth token"), std::string::npos);
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
  EXPECT_GE(took, 0.25);
  EXPECT_LT(took, 2.0);

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
  const auto dir =
      std::filesystem::temp_directory_path() / ("gpubox_server_test_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  ServerOptions so;
  so.data_dir = dir.string();
  auto first_table = std::make_unique<FakeHostTier>(test_config());
  auto server = start_server(first_table.get(), so);
  ASSERT_TRUE(server);
  so.port = server->port();
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
  std::filesystem::remove_all(dir);
}

TEST(Server, BarrierReleasesAllPartiesTogether) {
  FakeHostTier table(test_config());
  ServerOptions so;
  so.threads = 2;
  auto server = start_server(&table, so);
  ASSERT_TRUE(server);
  constexpr int kParties = 3;
  std::atomic<int> arrived{0}, passed{0};
  std::atomic<bool> early{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < kParties; ++t) {
    threads.emplace_back([&, t] {
      auto client = connect_client(client_options(server->endpoint()));
      ASSERT_TRUE(client);
      std::this_thread::sleep_for(std::chrono::milliseconds(30 * t));
      arrived.fetch_add(1);
      Status st = client->barrier("pass-1", kParties);
      ASSERT_TRUE(st.ok()) << st.to_string();
      if (arrived.load() < kParties) early = true;
      passed.fetch_add(1);
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_FALSE(early.load());
  EXPECT_EQ(passed.load(), kParties);

  // A lone party times out with a clear error; a disagreeing party count is refused.
  auto a = connect_client(client_options(server->endpoint()));
  auto b = connect_client(client_options(server->endpoint()));
  ASSERT_TRUE(a && b);
  Status st = a->barrier("lonely", 2, 0.2);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("BARRIER"), std::string::npos) << st.to_string();
  std::thread waiter([&] { (void)a->barrier("mixed", 2, 0.5); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  st = b->barrier("mixed", 3, 0.5);
  waiter.join();
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << st.to_string();
}

TEST(Server, ShutdownStopsGracefully) {
  FakeHostTier table(test_config());
  auto server = start_server(&table);
  ASSERT_TRUE(server);
  auto client = connect_client(client_options(server->endpoint()));
  ASSERT_TRUE(client);
  ASSERT_TRUE(client->shutdown_servers().ok());
  server->wait();  // returns: the SHUTDOWN stopped the threads
  EXPECT_TRUE(server->stopped());
}

// A TRAINING_ROLE=PSERVER server (exit_when_job_ends) stops once every trainer of its job ended
// it and left; before the last trainer ended it, or while they are connected (within the
// grace), it serves; a server started without the option outlives the job.
TEST(Server, JobEndStopsOnlyAServerStartedToExitWithItsJob) {
  FakeHostTier table(test_config());
  for (const bool exits : {false, true}) {
    ServerOptions so;
    so.exit_when_job_ends = exits;
    auto server = start_server(&table, so);
    ASSERT_TRUE(server);
    {
      auto a = connect_client(client_options(server->endpoint()));
      auto b = connect_client(client_options(server->endpoint()));
      ASSERT_TRUE(a && b);
      std::thread first([&] { EXPECT_TRUE(a->end_job(2).ok()); });
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      EXPECT_FALSE(server->stopped()) << "one trainer of two ended the job";
      const Status second = b->end_job(2);
      EXPECT_TRUE(second.ok()) << second.to_string();
      first.join();
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      EXPECT_FALSE(server->stopped()) << "its trainers are still connected";
      std::vector<uint64_t> keys{1, 2};
      std::vector<float> rows(keys.size() * static_cast<std::size_t>(a->layout().stride()));
      EXPECT_TRUE(a->pull(keys.data(), nullptr, keys.size(), rows.data(), nullptr).ok());
    }  // the trainers disconnect
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(exits ? 5 : 1);
    while (!server->stopped() && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    EXPECT_EQ(server->stopped(), exits) << "exit_when_job_ends=" << exits;
  }
}

}  // namespace
}  // namespace gpubox::table::server
