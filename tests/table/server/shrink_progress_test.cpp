// SHRINK on the server's worker (protocol 11): it runs off the network threads, as SAVE and LOAD
// do, and sends PROGRESS frames while the table reports steps (a shard done, a chunk of a shard's
// rows aged: HostTier::shrink), so that its client bounds it by the time without progress, not by
// its total time. A shrink that takes several bounds but moves completes; one that stops moving is
// reported within about the bound, naming the server and SHRINK; the rows it deletes are the
// oracle's at the table's edge sizes, and with a disk tier, where its steps count every disk
// entry scanned and every disk batch written; a server stopped under a shrink finishes it and
// loses no accepted row; a client of protocol 10 is refused with both versions named. A retried
// SHRINK runs once: shrink_dedupe_test.cpp.
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "table/sparse_table.hpp"
#include "tests/table/forwarding_host_tier.hpp"
#include "tests/table/server/server_test_util.hpp"
#include "tests/table/server/shrink_test_util.hpp"
#include "tests/table/shrink_oracle.hpp"
#include "tests/table/table_test_util.hpp"

namespace gpubox::table::server {
namespace {

using namespace testing;      // NOLINT: the loopback helpers
using namespace shrink_test;  // NOLINT: the slowed tier, tables, servers, clients

TEST(ShrinkProgress, AShrinkLongerThanTheBoundThatMovesCompletes) {
  HeldShrinkServer held(16, test_config());
  ASSERT_TRUE(held.server);
  auto client = connect_client(bounded_client(held.server->endpoint(), test_config()));
  ASSERT_TRUE(client);
  const std::vector<uint64_t> keys = spread_keys(300, 1);
  std::vector<float> rows(keys.size() * client->layout().stride());
  ASSERT_TRUE(client->pull(keys.data(), nullptr, keys.size(), rows.data(), nullptr).ok());

  // Held after its first shard, moving (a step every 50 ms), for 2.5 bounds, then let go.
  held.tier.hold_at(1, SlowShrinkTier::Hold::kMoving);
  const auto start = std::chrono::steady_clock::now();
  StatusOr<uint64_t> deleted = Status::Internal("not run");
  std::thread shrinking([&] { deleted = client->shrink(); });
  // Held for 2.5 bounds from when the shrink reached its hold (on a loaded machine the call may
  // take a while to get there; released before, it would never have been held).
  const bool reached = eventually([&] { return held.tier.holding(); }, 60.0);
  std::this_thread::sleep_for(std::chrono::duration<double>(2.5 * kBoundS));
  held.tier.release();
  shrinking.join();
  const double took_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("SHRINK: %lld steps, %.2f s, bound %.1f s\n",
              static_cast<long long>(held.tier.steps()), took_s, kBoundS);
  ASSERT_TRUE(reached) << "the shrink never reached its hold";
  ASSERT_TRUE(deleted.ok()) << deleted.status().to_string();
  EXPECT_EQ(*deleted, 0u);  // test_config keeps every row (delete_threshold 0)
  // The call outlived its bound: the client bounded it by progress, not by its total time.
  EXPECT_GT(took_s, 2 * kBoundS);
  EXPECT_EQ(held.tier.steps(), 16);  // one per shard
  EXPECT_GT(client->progress_frames(), 0u);
  EXPECT_EQ(held.server->counters().bulk_runs, 1u);
}

// A shrink that stops moving (held after its first shard, as a server stuck in its own code):
// DeadlineExceeded naming SHRINK and the server, long before the held step lets go. The server
// serves other calls meanwhile: its network threads do not run the shrink.
TEST(ShrinkProgress, AShrinkThatStopsMovingFailsNamingTheServer) {
  HeldShrinkServer held(4, test_config());
  ASSERT_TRUE(held.server);
  auto client = connect_client(bounded_client(held.server->endpoint(), test_config()));
  ASSERT_TRUE(client);
  held.tier.hold_at(1, SlowShrinkTier::Hold::kStopped);
  StatusOr<uint64_t> deleted = client->shrink();
  ASSERT_FALSE(deleted.ok());
  const Status& st = deleted.status();
  std::printf("stuck SHRINK: %s\n", st.to_string().c_str());
  EXPECT_EQ(st.code(), Status::Code::kDeadlineExceeded) << st.to_string();
  EXPECT_NE(st.message().find("SHRINK to " + held.server->endpoint()), std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find("no progress reported for"), std::string::npos) << st.message();
  EXPECT_TRUE(held.tier.holding());
  EXPECT_TRUE(client->stats().ok());
}

// The accessor's shrink rule one key at a time, as SparseShard::age_row applies it.
class ShrinkOracle {
 public:
  explicit ShrinkOracle(const AccessorConfig& cfg) : cfg_(cfg) {}
  void push(const std::vector<uint64_t>& keys, const std::vector<float>& rows, std::size_t stride) {
    for (std::size_t i = 0; i < keys.size(); ++i) {
      rows_[keys[i]].assign(rows.begin() + i * stride, rows.begin() + (i + 1) * stride);
    }
  }
  uint64_t shrink() { return gpubox::table::testing::shrink_rows(&rows_, cfg_); }
  std::size_t size() const { return rows_.size(); }
  std::vector<uint64_t> keys() const {
    std::vector<uint64_t> out;
    for (const auto& entry : rows_) out.push_back(entry.first);
    std::sort(out.begin(), out.end());
    return out;
  }
  // Moves the rows of `keys` (all of them when null) to `to`; `seen`: as a PULL leaves them,
  // unseen for no day.
  void move_to(ShrinkOracle* to, const std::vector<uint64_t>* keys, bool seen) {
    for (uint64_t key : keys != nullptr ? *keys : this->keys()) {
      std::vector<float>& row = to->rows_[key] = std::move(rows_.at(key));
      if (seen) row[RowLayout::kUnseenDays] = 0.0f;
      rows_.erase(key);
    }
  }

 private:
  AccessorConfig cfg_;
  std::unordered_map<uint64_t, std::vector<float>> rows_;
};

// Counts the progress steps of each shrink (the server's PROGRESS frames count them).
class CountingTier final : public table::testing::ForwardingHostTier {
 public:
  using ForwardingHostTier::ForwardingHostTier;
  using HostTier::shrink;
  StatusOr<uint64_t> shrink(const std::function<void()>& on_progress) override {
    steps = 0;
    return inner().shrink([&] {
      ++steps;
      if (on_progress) on_progress();
    });
  }
  std::atomic<int64_t> steps{0};
};

AccessorConfig deleting_config() {
  AccessorConfig cfg = test_config();
  cfg.delete_threshold = 2.0f;          // rows of few shows go on the first days
  cfg.delete_after_unseen_days = 2.0f;  // every row goes on the third
  return cfg;
}

// (shards, rows): no rows, one, one per shard and one more, and one shard of a progress chunk's
// rows (SparseShard::kShrinkProgressRows) and one more.
class ShrinkOracleTest : public ::testing::TestWithParam<std::tuple<uint32_t, std::size_t>> {};

TEST_P(ShrinkOracleTest, DeletedRowsMatchTheOracle) {
  const auto [shards, n] = GetParam();
  const AccessorConfig cfg = deleting_config();
  auto table = sparse_table(shards, cfg);
  CountingTier counting(*table);
  auto server = start_server(&counting, progress_options());
  ASSERT_TRUE(server);
  RemoteHostTierOptions options = bounded_client(server->endpoint(), cfg);
  options.deadline_s = 30;
  auto client = connect_client(options);
  ASSERT_TRUE(client);
  const std::size_t stride = client->layout().stride();
  std::mt19937_64 rng(20261201 + shards * 131 + n);
  const std::vector<uint64_t> keys = spread_keys(n, rng() % 1000);
  std::vector<float> rows;
  rows.reserve(n * stride);
  for (std::size_t i = 0; i < n; ++i) {
    const std::vector<float> row = table::testing::random_row(rng, client->layout());
    rows.insert(rows.end(), row.begin(), row.end());
  }
  ASSERT_TRUE(client->push(keys.data(), n, rows.data()).ok());
  ShrinkOracle oracle(cfg);
  oracle.push(keys, rows, stride);
  for (int day = 0; day < 3; ++day) {
    const std::size_t before = oracle.size();
    StatusOr<uint64_t> deleted = client->shrink();
    ASSERT_TRUE(deleted.ok()) << deleted.status().to_string();
    EXPECT_EQ(*deleted, oracle.shrink()) << "day " << day;
    StatusOr<HostTierStats> stats = client->stats();
    ASSERT_TRUE(stats.ok()) << stats.status().to_string();
    EXPECT_EQ(stats->rows_in_memory, oracle.size()) << "day " << day;
    // A step per shard, and one per chunk of rows aged within a shard (one shard: all of them).
    if (shards == 1) {
      EXPECT_EQ(counting.steps.load(),
                static_cast<int64_t>(1 + before / SparseShard::kShrinkProgressRows))
          << "day " << day;
    } else {
      EXPECT_EQ(counting.steps.load(), static_cast<int64_t>(shards)) << "day " << day;
    }
  }
  EXPECT_EQ(oracle.size(), 0u);  // the third day's unseen rule took the rest
}

INSTANTIATE_TEST_SUITE_P(
    EdgeSizes, ShrinkOracleTest,
    ::testing::Values(std::make_tuple(4u, std::size_t{0}), std::make_tuple(4u, std::size_t{1}),
                      std::make_tuple(4u, std::size_t{4}), std::make_tuple(4u, std::size_t{5}),
                      std::make_tuple(1u, std::size_t{SparseShard::kShrinkProgressRows}),
                      std::make_tuple(1u, std::size_t{SparseShard::kShrinkProgressRows + 1})));

// The steps of one shard's shrink with a disk tier: one per kShrinkProgressRows entries looked at
// (`scanned` disk entries, copies of memory rows too, and `aged` memory rows), one per disk batch
// of the `dead` memory rows' erases (each with a disk copy) and of the `cold` rows written, and
// one for the shard done.
int64_t disk_shrink_steps(std::size_t scanned, std::size_t aged, std::size_t dead,
                          std::size_t cold) {
  constexpr std::size_t kRows = SparseShard::kShrinkProgressRows;
  constexpr std::size_t kBatch = std::size_t{1} << 16;  // SparseShard::kDiskBatchEntries
  const auto batches = [](std::size_t n) { return (n + kBatch - 1) / kBatch; };
  return static_cast<int64_t>((scanned + aged) / kRows + batches(dead) + batches(cold) + 1);
}

// One shard with a disk tier (cold_after_days 1): its rows move to disk on the first day, half
// come back by a PULL (each then in memory with a disk copy), and the following days age them
// on disk and in memory. The rows deleted match the oracle's, and the steps are exact: every disk
// entry scanned counts, and every disk batch written is a step.
class DiskShrinkOracleTest : public ::testing::TestWithParam<std::size_t> {};

TEST_P(DiskShrinkOracleTest, DeletedRowsAndStepsMatchTheOracle) {
  const std::size_t n = GetParam();
  const AccessorConfig cfg = deleting_config();
  table::testing::ScratchDir dir;
  auto table = sparse_table(1, cfg, dir.sub("rocksdb"));
  CountingTier counting(*table);
  auto server = start_server(&counting, progress_options());
  ASSERT_TRUE(server);
  RemoteHostTierOptions options = bounded_client(server->endpoint(), cfg);
  options.deadline_s = 60;
  auto client = connect_client(options);
  ASSERT_TRUE(client);
  const std::size_t stride = client->layout().stride();
  std::mt19937_64 rng(20261202 + n);
  const std::vector<uint64_t> keys = spread_keys(n, rng() % 1000);
  std::vector<float> rows;
  for (std::size_t i = 0; i < n; ++i) {
    const std::vector<float> row = table::testing::random_row(rng, client->layout());
    rows.insert(rows.end(), row.begin(), row.end());
  }
  ASSERT_TRUE(client->push(keys.data(), n, rows.data()).ok());
  ShrinkOracle memory(cfg);
  ShrinkOracle disk(cfg);
  memory.push(keys, rows, stride);
  const auto shrink_and_check = [&](int day, int64_t steps) {
    StatusOr<uint64_t> deleted = client->shrink();
    ASSERT_TRUE(deleted.ok()) << deleted.status().to_string();
    const uint64_t expected = disk.shrink() + memory.shrink();
    EXPECT_EQ(*deleted, expected) << "day " << day;
    EXPECT_EQ(counting.steps.load(), steps) << "day " << day;
    std::printf("day %d: %llu deleted, %lld steps\n", day,
                static_cast<unsigned long long>(expected), static_cast<long long>(steps));
    memory.move_to(&disk, nullptr, /*seen=*/false);  // every survivor is a day unseen: cold
    StatusOr<HostTierStats> stats = client->stats();
    ASSERT_TRUE(stats.ok()) << stats.status().to_string();
    EXPECT_EQ(stats->rows_in_memory, 0u) << "day " << day;
    EXPECT_EQ(stats->rows_on_disk, disk.size()) << "day " << day;
  };
  // Day 0: every row aged in memory, the survivors written to disk.
  {
    ShrinkOracle probe = memory;
    probe.shrink();
    shrink_and_check(0, disk_shrink_steps(0, n, 0, probe.size()));
  }
  // Half the rows on disk come back to memory; their disk copies stay.
  const std::size_t entries = disk.size();
  std::vector<uint64_t> back = disk.keys();
  back.resize(back.size() / 2);
  std::vector<float> pulled(back.size() * stride);
  ASSERT_TRUE(client->pull(back.data(), nullptr, back.size(), pulled.data(), nullptr).ok());
  disk.move_to(&memory, &back, /*seen=*/true);
  {
    ShrinkOracle probe = memory;
    const std::size_t dead = probe.shrink();
    shrink_and_check(1, disk_shrink_steps(entries, back.size(), dead, probe.size()));
  }
  for (int day = 2; day < 6 && disk.size() > 0; ++day) {
    shrink_and_check(day, disk_shrink_steps(disk.size(), 0, 0, 0));
  }
  EXPECT_EQ(disk.size(), 0u);
}

INSTANTIATE_TEST_SUITE_P(DiskTier, DiskShrinkOracleTest,
                         ::testing::Values(std::size_t{200},
                                           std::size_t{SparseShard::kShrinkProgressRows + 1}));

// What Server::stop and wait (SIGTERM, SHUTDOWN) do to a SHRINK under way, as to a SAVE: wait()
// reaches the worker while the shrink runs (it is not on a network thread, which wait() would
// join first) and lets it finish; its client's call ends with an error naming the server, or
// its reply. Every row pushed before or during the shrink is kept: the table holds the oracle's
// survivors of one shrink and every row accepted while it ran.
TEST(ShrinkProgress, AServerStoppedUnderAShrinkFinishesItAndKeepsAcceptedRows) {
  const AccessorConfig cfg = deleting_config();
  ServerOptions options = progress_options();
  std::atomic<bool> stopping_worker{false};  // wait() reached the worker, the shrink under way
  options.stopping_worker_hook = [&] { stopping_worker = true; };
  HeldShrinkServer held(4, cfg, options);
  ASSERT_TRUE(held.server);
  RemoteHostTierOptions client_opts = bounded_client(held.server->endpoint(), cfg);
  client_opts.deadline_s = 3;
  auto client = connect_client(client_opts);
  auto pusher = connect_client(client_opts);
  ASSERT_TRUE(client && pusher);
  const std::size_t stride = client->layout().stride();
  std::mt19937_64 rng(77);
  const std::vector<uint64_t> keys = spread_keys(200, 5000);
  std::vector<float> rows;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const std::vector<float> row = table::testing::random_row(rng, client->layout());
    rows.insert(rows.end(), row.begin(), row.end());
  }
  ASSERT_TRUE(client->push(keys.data(), keys.size(), rows.data()).ok());
  ShrinkOracle oracle(cfg);
  oracle.push(keys, rows, stride);
  const uint64_t expect_deleted = oracle.shrink();

  // Held (moving) after its first shard; rows pushed meanwhile are acknowledged.
  held.tier.hold_at(1, SlowShrinkTier::Hold::kMoving);
  StatusOr<uint64_t> shrunk = Status::Internal("not run");
  std::thread shrinking([&] { shrunk = client->shrink(); });
  ASSERT_TRUE(eventually([&] { return held.tier.holding(); }, 60.0));
  const std::vector<uint64_t> late_keys = spread_keys(50, 90000);
  std::vector<float> late_rows;
  for (std::size_t i = 0; i < late_keys.size(); ++i) {
    std::vector<float> row = table::testing::random_row(rng, client->layout());
    row[RowLayout::kShow] = 1000.0f;  // survives the shrink's aging
    row[RowLayout::kClick] = 300.0f;
    late_rows.insert(late_rows.end(), row.begin(), row.end());
  }
  ASSERT_TRUE(pusher->push(late_keys.data(), late_keys.size(), late_rows.data()).ok());

  held.server->stop();
  std::atomic<bool> waited{false};
  std::thread waiting([&] {
    held.server->wait();
    waited = true;
  });
  // wait() reaches the worker while the shrink is under way, and does not return before it ends.
  EXPECT_TRUE(eventually([&] { return stopping_worker.load(); }, 20.0));
  EXPECT_FALSE(waited.load());
  held.tier.release();
  waiting.join();
  shrinking.join();
  EXPECT_TRUE(waited.load());
  std::printf("the client's SHRINK: %s\n", shrunk.status().to_string().c_str());
  if (shrunk.ok()) {
    EXPECT_EQ(*shrunk, expect_deleted);
  } else {
    EXPECT_NE(shrunk.status().message().find("SHRINK to " + held.server->endpoint()),
              std::string::npos)
        << shrunk.status().to_string();
  }
  // The shrink finished whole, and no accepted row was lost.
  StatusOr<HostTierStats> stats = held.table->stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->rows_in_memory, oracle.size() + late_keys.size());
  std::vector<float> peeked(late_keys.size() * stride);
  std::size_t unknown = 0;
  ASSERT_TRUE(
      held.table->peek(late_keys.data(), nullptr, late_keys.size(), peeked.data(), &unknown).ok());
  EXPECT_EQ(unknown, 0u);
}

// Reads exactly `n` bytes of `conn`, each within two seconds.
bool read_exact(Connection& conn, uint8_t* out, std::size_t n) {
  std::size_t got = 0;
  while (got < n) {
    if (!readable_within(conn.fd(), 2.0)) return false;
    const ssize_t k = ::recv(conn.fd(), out + got, n - got, 0);
    if (k <= 0) return false;
    got += static_cast<std::size_t>(k);
  }
  return true;
}

// A client of protocol 10 (SHRINK bounded in all, no PROGRESS frames) sends SHRINK: refused, in
// a reply of its own version, naming both versions; the table is not shrunk.
TEST(ShrinkProgress, AProtocol10ClientIsRefusedNamingBothVersions) {
  HeldShrinkServer held(4, test_config());
  ASSERT_TRUE(held.server);
  Connection old = raw_connection(held.server->port());
  constexpr uint16_t kOld = 10;
  FrameHeader h;
  h.op = Op::kShrink;
  h.request_id = 9;
  h.client_id = 4;
  std::vector<uint8_t> frame(kHeaderBytes);
  encode_header(h, frame.data(), kOld);
  ASSERT_TRUE(old.send_all(frame.data(), frame.size(), seconds_from_now(2)).ok());
  std::vector<uint8_t> reply(kHeaderBytes);
  ASSERT_TRUE(read_exact(old, reply.data(), reply.size()));
  EXPECT_EQ(header_version(reply.data(), reply.size()), kOld);
  std::memcpy(reply.data() + 4, &kProtocolVersion, sizeof(kProtocolVersion));
  auto header = decode_header(reply.data(), reply.size(), kDefaultMaxPayloadBytes);
  ASSERT_TRUE(header.ok()) << header.status().to_string();
  EXPECT_EQ(header->request_id, 9u);
  std::vector<uint8_t> payload(header->payload_bytes);
  ASSERT_TRUE(read_exact(old, payload.data(), payload.size()));
  const Status st = decode_error_reply(*header, payload.data(), payload.size());
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << st.to_string();
  EXPECT_NE(st.message().find("unsupported protocol version 10: this gpubox_server speaks "
                              "protocol version 11"),
            std::string::npos)
      << st.to_string();
  EXPECT_EQ(held.tier.steps(), 0);  // nothing shrunk
}

}  // namespace
}  // namespace gpubox::table::server
