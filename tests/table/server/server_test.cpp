// gpubox_server and RemoteHostTier on loopback, in-process: the server runs on an ephemeral port
// over a FakeHostTier (an unordered_map), clients check every row against an oracle
// (server_oracle.hpp): concurrent clients, PEEK, sharding, frame limits, BARRIER, SHUTDOWN and
// the job's end. What goes wrong (bad frames, dead servers, restarts): server_faults_test.cpp.
#include "table/server/server.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "table/server/remote_host_tier.hpp"
#include "tests/table/server/fake_host_tier.hpp"
#include "tests/table/server/server_oracle.hpp"
#include "tests/table/server/server_test_util.hpp"
#if GPUBOX_HAVE_SPARSE_TABLE
#include "table/sparse_table.hpp"
#endif

namespace gpubox::table::server {
namespace {

using namespace testing;  // NOLINT: FakeHostTier and the loopback helpers

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
  // Its wait ran out: DeadlineExceeded (a trainer tells it from a lost server, Unavailable, by
  // code: PsTrainer::meet).
  EXPECT_EQ(st.code(), Status::Code::kDeadlineExceeded) << st.to_string();
  EXPECT_NE(st.message().find("BARRIER"), std::string::npos) << st.to_string();
  EXPECT_NE(st.message().find("no reply before the deadline"), std::string::npos) << st.to_string();
  // The lonely party's wait ends on the server too once its client gave up (its connection
  // closed). The disagreeing party comes once the first waits (the server counts it), and is
  // refused without counting: a second party of two then releases the first.
  EXPECT_TRUE(eventually([&] { return server->counters().barrier_waiters == 0; }));
  Status first;
  std::thread waiter([&] { first = a->barrier("mixed", 2, 10); });
  EXPECT_TRUE(eventually([&] { return server->counters().barrier_waiters == 1; }));
  st = b->barrier("mixed", 3, 10);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << st.to_string();
  EXPECT_NE(st.message().find("3 parties, but 2 announced"), std::string::npos) << st.to_string();
  auto c = connect_client(client_options(server->endpoint()));
  EXPECT_TRUE(c) << "the second party of two did not connect";
  if (c) {  // not ASSERT: the waiter thread must be joined
    EXPECT_TRUE(c->barrier("mixed", 2, 10).ok());
  }
  waiter.join();
  EXPECT_TRUE(first.ok()) << first.to_string();
  EXPECT_EQ(server->counters().barrier_waiters, 0u);
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

// A stopped server closes the connections still open once its threads ended (Server::wait), each
// told "server stopped": a call waiting on one fails at once naming the server, not at its
// deadline, and a client's idle pooled connection is dropped so that its next call reaches a
// server restarted on the same port at once. (Before, they stayed open until the Server was
// destroyed: the barrier waited its 8 s, the pull its 3 s deadline.)
TEST(Server, AStoppedServerClosesItsConnectionsAndClientsLearnAtOnce) {
  using Clock = std::chrono::steady_clock;
  FakeHostTier table(test_config());
  ServerOptions first;
  first.port = gpubox::testing::port_below_ephemeral_range();  // restarted on it below
  auto server = start_server(&table, first);
  ASSERT_TRUE(server);
  const uint16_t port = server->port();
  auto waiting = connect_client(client_options(server->endpoint()));
  // A deadline far over the bound below, so that a loaded machine's slower reconnect is not
  // taken for waiting out the deadline.
  RemoteHostTierOptions idle_options = client_options(server->endpoint());
  idle_options.deadline_s = 20.0;
  auto idle = connect_client(idle_options);
  ASSERT_TRUE(waiting && idle);
  std::vector<uint64_t> keys{1, 2, 3};
  std::vector<float> rows(keys.size() * static_cast<std::size_t>(idle->layout().stride()));
  ASSERT_TRUE(idle->pull(keys.data(), nullptr, keys.size(), rows.data(), nullptr).ok());
  constexpr double kBarrierDeadlineS = 8.0;
  Status waited;
  Clock::time_point answered;
  std::thread waiter([&] {
    waited = waiting->barrier("never", 2, kBarrierDeadlineS);
    answered = Clock::now();
  });
  const bool queued = eventually([&] { return server->counters().barrier_waiters == 1; });
  const auto stopped_at = Clock::now();
  server->stop();
  server->wait();
  waiter.join();
  ASSERT_TRUE(queued) << "the barrier call never waited";
  EXPECT_EQ(server->counters().open_connections, 0u);
  EXPECT_EQ(waited.code(), Status::Code::kUnavailable) << waited.to_string();
  EXPECT_NE(waited.message().find("127.0.0.1:" + std::to_string(port)), std::string::npos)
      << waited.to_string();
  EXPECT_NE(waited.message().find("server stopped"), std::string::npos) << waited.to_string();
  EXPECT_LT(answered - stopped_at, std::chrono::seconds(2))
      << "the waiting call learned of the stop only near its deadline: " << waited.to_string();

  ServerOptions again;
  again.port = port;
  auto restarted = start_server(&table, again);
  ASSERT_TRUE(restarted);
  const auto asked = Clock::now();
  const Status pulled = idle->pull(keys.data(), nullptr, keys.size(), rows.data(), nullptr);
  EXPECT_TRUE(pulled.ok()) << pulled.to_string();
  EXPECT_LT(Clock::now() - asked, std::chrono::seconds(5))
      << "the pooled connection to the stopped server was used until the deadline";
}

// A TRAINING_ROLE=PSERVER server (exit_when_job_ends) stops once every trainer of its job ended
// it and left; before the last trainer ended it, or while they are connected (within the
// grace), it serves; a server started without the option outlives the job. The job's end is
// acted on at the server's sweeps: "serves" after it is read once two more sweeps ran (one begun
// after the event saw it).
TEST(Server, JobEndStopsOnlyAServerStartedToExitWithItsJob) {
  FakeHostTier table(test_config());
  for (const bool exits : {false, true}) {
    ServerOptions so;
    so.exit_when_job_ends = exits;
    auto server = start_server(&table, so);
    ASSERT_TRUE(server);
    const auto swept_twice = [&] {
      const uint64_t sweeps = server->counters().sweeps;
      return eventually(
          [&] { return server->stopped() || server->counters().sweeps >= sweeps + 2; });
    };
    {
      auto a = connect_client(client_options(server->endpoint()));
      auto b = connect_client(client_options(server->endpoint()));
      ASSERT_TRUE(a && b);
      std::thread first([&] { EXPECT_TRUE(a->end_job(2).ok()); });
      EXPECT_TRUE(eventually([&] { return server->counters().barrier_waiters == 1; }))
          << "the first trainer's end never waited";
      EXPECT_FALSE(server->stopped()) << "one trainer of two ended the job";
      const Status second = b->end_job(2);
      EXPECT_TRUE(second.ok()) << second.to_string();
      first.join();
      EXPECT_TRUE(swept_twice());
      EXPECT_FALSE(server->stopped()) << "its trainers are still connected";
      std::vector<uint64_t> keys{1, 2};
      std::vector<float> rows(keys.size() * static_cast<std::size_t>(a->layout().stride()));
      EXPECT_TRUE(a->pull(keys.data(), nullptr, keys.size(), rows.data(), nullptr).ok());
    }  // the trainers disconnect
    EXPECT_TRUE(eventually([&] { return server->counters().open_connections == 0; }));
    if (exits) {
      EXPECT_TRUE(eventually([&] { return server->stopped(); })) << "the job ended, all left";
    } else {
      EXPECT_TRUE(swept_twice());
      EXPECT_FALSE(server->stopped())
          << "a server started without exit_when_job_ends stopped at its job's end";
    }
  }
}

}  // namespace
}  // namespace gpubox::table::server
