// SHRINK on the server's worker (protocol 11): it runs off the network threads, as SAVE and LOAD
// do, and sends PROGRESS frames while the table reports steps (a shard done, a chunk of a shard's
// rows aged: HostTier::shrink), so that its client bounds it by the time without progress, not by
// its total time. A shrink that takes several bounds but moves completes; one that stops moving is
// reported within about the bound, naming the server and SHRINK; the rows it deletes are the
// oracle's at the table's edge sizes; a server stopped under a shrink finishes it and loses no
// accepted row; a client of protocol 10 is refused with both versions named.
#include <gtest/gtest.h>
#include <sys/socket.h>

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
#include "tests/table/table_test_util.hpp"

namespace gpubox::table::server {
namespace {

using namespace testing;  // NOLINT: the loopback helpers
using std::chrono::milliseconds;

constexpr double kBoundS = 1.5;  // the client's bound without progress
// Each step of a slowed shrink: well under the bound, so that the shrink moves.
constexpr milliseconds kStepDelay{250};

// A tier whose SHRINK steps (the table's progress calls: a shard done, a chunk of rows aged) each
// wait `delay` first (one at a time, so a shrink of n steps takes at least n times it), and from
// step `hold_at` on are held until release(): kStopped reports nothing meanwhile (a server stuck
// in its own code), kMoving reports the step every 50 ms (a shrink that moves for as long as the
// test wants). A held step lets go by itself after a minute, so that a test that went wrong
// fails instead of hanging.
class SlowShrinkTier final : public table::testing::ForwardingHostTier {
 public:
  enum class Hold { kStopped, kMoving };

  SlowShrinkTier(HostTier& inner, milliseconds delay) : ForwardingHostTier(inner), delay_(delay) {}
  ~SlowShrinkTier() override { release(); }

  void hold_at(int64_t step, Hold how) {
    std::lock_guard<std::mutex> lock(mu_);
    hold_at_ = step;
    hold_ = how;
  }
  void release() {
    std::lock_guard<std::mutex> lock(mu_);
    released_ = true;
    released_cv_.notify_all();
  }
  int64_t steps() const {
    std::lock_guard<std::mutex> lock(mu_);
    return steps_;
  }
  bool holding() const {
    std::lock_guard<std::mutex> lock(mu_);
    return holding_;
  }

  using HostTier::shrink;
  StatusOr<uint64_t> shrink(const std::function<void()>& on_progress) override {
    return inner().shrink([&] { step(on_progress); });
  }

 private:
  void step(const std::function<void()>& on_progress) {
    std::unique_lock<std::mutex> lock(mu_);
    const int64_t at = steps_++;
    std::this_thread::sleep_for(delay_);  // under the lock: the steps take turns
    if (hold_at_ >= 0 && at >= hold_at_ && !released_) hold(lock, on_progress);
    lock.unlock();
    if (on_progress) on_progress();
  }
  void hold(std::unique_lock<std::mutex>& lock, const std::function<void()>& on_progress) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    holding_ = true;
    while (!released_ && std::chrono::steady_clock::now() < until) {
      if (hold_ == Hold::kStopped) {
        released_cv_.wait_until(lock, until);
        continue;
      }
      lock.unlock();
      if (on_progress) on_progress();  // still moving: the server sees the shrink step on
      std::this_thread::sleep_for(milliseconds(50));
      lock.lock();
    }
    holding_ = false;
  }

  const milliseconds delay_;
  mutable std::mutex mu_;
  std::condition_variable released_cv_;
  int64_t steps_ = 0;
  int64_t hold_at_ = -1;
  Hold hold_ = Hold::kStopped;
  bool released_ = false;
  bool holding_ = false;
};

// Lets a held tier go at the end of a scope, before the server declared earlier waits for its
// worker (also when an assertion left the test early).
struct ReleaseAtEnd {
  SlowShrinkTier& tier;
  ~ReleaseAtEnd() { tier.release(); }
};

std::unique_ptr<SparseTable> sparse_table(uint32_t shards, const AccessorConfig& cfg) {
  HostTableConfig table_cfg;
  table_cfg.shards = shards;
  auto table = SparseTable::open(cfg, table_cfg);
  EXPECT_TRUE(table.ok()) << table.status().to_string();
  return std::move(table).value();
}

ServerOptions progress_options() {
  ServerOptions so;
  so.progress_interval_s = 0.1;
  return so;
}

RemoteHostTierOptions bounded_client(const std::string& endpoints, const AccessorConfig& cfg) {
  RemoteHostTierOptions o = client_options(endpoints);
  o.config = cfg;
  o.deadline_s = kBoundS;
  o.chunk_rows = 4096;
  return o;
}

std::vector<uint64_t> spread_keys(std::size_t n, uint64_t first) {
  std::vector<uint64_t> keys(n);
  for (std::size_t i = 0; i < n; ++i) keys[i] = (first + i) * 0x9e3779b97f4a7c15ULL;
  return keys;
}

TEST(ShrinkProgress, AShrinkLongerThanTheBoundThatMovesCompletes) {
  auto table = sparse_table(16, test_config());
  SlowShrinkTier slow(*table, kStepDelay);
  auto server = start_server(&slow, progress_options());
  ASSERT_TRUE(server);
  ReleaseAtEnd release{slow};
  auto client = connect_client(bounded_client(server->endpoint(), test_config()));
  ASSERT_TRUE(client);
  const std::vector<uint64_t> keys = spread_keys(300, 1);
  std::vector<float> rows(keys.size() * client->layout().stride());
  ASSERT_TRUE(client->pull(keys.data(), nullptr, keys.size(), rows.data(), nullptr).ok());

  StatusOr<uint64_t> deleted = client->shrink();
  ASSERT_TRUE(deleted.ok()) << deleted.status().to_string();
  EXPECT_EQ(*deleted, 0u);  // test_config keeps every row (delete_threshold 0)
  // One step per shard, each slowed: the shrink took at least this long, several bounds.
  const double took_s = static_cast<double>(slow.steps()) * kStepDelay.count() / 1000.0;
  std::printf("SHRINK: %lld slowed steps, at least %.2f s, bound %.1f s\n",
              static_cast<long long>(slow.steps()), took_s, kBoundS);
  EXPECT_EQ(slow.steps(), 16);
  EXPECT_GE(took_s, 2 * kBoundS);
  EXPECT_GT(client->progress_frames(), 0u);
  EXPECT_EQ(server->counters().bulk_runs, 1u);
}

// A shrink that stops moving (held after its first shard, as a server stuck in its own code):
// DeadlineExceeded naming SHRINK and the server, long before the held step lets go. The server
// serves other calls meanwhile: its network threads do not run the shrink.
TEST(ShrinkProgress, AShrinkThatStopsMovingFailsNamingTheServer) {
  auto table = sparse_table(4, test_config());
  SlowShrinkTier stuck(*table, milliseconds(0));
  auto server = start_server(&stuck, progress_options());
  ASSERT_TRUE(server);
  ReleaseAtEnd release{stuck};
  auto client = connect_client(bounded_client(server->endpoint(), test_config()));
  ASSERT_TRUE(client);
  stuck.hold_at(1, SlowShrinkTier::Hold::kStopped);
  StatusOr<uint64_t> deleted = client->shrink();
  ASSERT_FALSE(deleted.ok());
  const Status& st = deleted.status();
  std::printf("stuck SHRINK: %s\n", st.to_string().c_str());
  EXPECT_EQ(st.code(), Status::Code::kDeadlineExceeded) << st.to_string();
  EXPECT_NE(st.message().find("SHRINK to " + server->endpoint()), std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find("no progress reported for"), std::string::npos) << st.message();
  EXPECT_TRUE(stuck.holding());
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
  uint64_t shrink() {
    uint64_t deleted = 0;
    for (auto it = rows_.begin(); it != rows_.end();) {
      float* row = it->second.data();
      row[RowLayout::kShow] *= cfg_.show_click_decay_rate;
      row[RowLayout::kClick] *= cfg_.show_click_decay_rate;
      row[RowLayout::kUnseenDays] += 1.0f;
      if (row_score(row, cfg_) < cfg_.delete_threshold ||
          row[RowLayout::kUnseenDays] > cfg_.delete_after_unseen_days) {
        it = rows_.erase(it);
        ++deleted;
      } else {
        ++it;
      }
    }
    return deleted;
  }
  std::size_t size() const { return rows_.size(); }

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

// What Server::stop and wait (SIGTERM, SHUTDOWN) do to a SHRINK under way, as to a SAVE: wait()
// reaches the worker while the shrink runs (it is not on a network thread, which wait() would
// join first) and lets it finish; its client's call ends with an error naming the server, or
// its reply. Every row pushed before or during the shrink is kept: the table holds the oracle's
// survivors of one shrink and every row accepted while it ran.
TEST(ShrinkProgress, AServerStoppedUnderAShrinkFinishesItAndKeepsAcceptedRows) {
  const AccessorConfig cfg = deleting_config();
  auto table = sparse_table(4, cfg);
  SlowShrinkTier held(*table, milliseconds(0));
  ServerOptions options = progress_options();
  std::atomic<bool> stopping_worker{false};  // wait() reached the worker, the shrink under way
  options.stopping_worker_hook = [&] { stopping_worker = true; };
  auto server = start_server(&held, options);
  ASSERT_TRUE(server);
  ReleaseAtEnd release{held};
  RemoteHostTierOptions client_opts = bounded_client(server->endpoint(), cfg);
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
  held.hold_at(1, SlowShrinkTier::Hold::kMoving);
  StatusOr<uint64_t> shrunk = Status::Internal("not run");
  std::thread shrinking([&] { shrunk = client->shrink(); });
  ASSERT_TRUE(eventually([&] { return held.holding(); }, 60.0));
  const std::vector<uint64_t> late_keys = spread_keys(50, 90000);
  std::vector<float> late_rows;
  for (std::size_t i = 0; i < late_keys.size(); ++i) {
    std::vector<float> row = table::testing::random_row(rng, client->layout());
    row[RowLayout::kShow] = 1000.0f;  // survives the shrink's aging
    row[RowLayout::kClick] = 300.0f;
    late_rows.insert(late_rows.end(), row.begin(), row.end());
  }
  ASSERT_TRUE(pusher->push(late_keys.data(), late_keys.size(), late_rows.data()).ok());

  server->stop();
  std::atomic<bool> waited{false};
  std::thread waiting([&] {
    server->wait();
    waited = true;
  });
  // wait() reaches the worker while the shrink is under way, and does not return before it ends.
  EXPECT_TRUE(eventually([&] { return stopping_worker.load(); }, 20.0));
  EXPECT_FALSE(waited.load());
  held.release();
  waiting.join();
  shrinking.join();
  EXPECT_TRUE(waited.load());
  std::printf("the client's SHRINK: %s\n", shrunk.status().to_string().c_str());
  if (shrunk.ok()) {
    EXPECT_EQ(*shrunk, expect_deleted);
  } else {
    EXPECT_NE(shrunk.status().message().find("SHRINK to " + server->endpoint()), std::string::npos)
        << shrunk.status().to_string();
  }
  // The shrink finished whole, and no accepted row was lost.
  StatusOr<HostTierStats> stats = table->stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->rows_in_memory, oracle.size() + late_keys.size());
  std::vector<float> peeked(late_keys.size() * stride);
  std::size_t unknown = 0;
  ASSERT_TRUE(
      table->peek(late_keys.data(), nullptr, late_keys.size(), peeked.data(), &unknown).ok());
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
  auto table = sparse_table(4, test_config());
  SlowShrinkTier counted(*table, milliseconds(0));
  auto server = start_server(&counted, progress_options());
  ASSERT_TRUE(server);
  Connection old = raw_connection(server->port());
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
  EXPECT_EQ(counted.steps(), 0);  // nothing shrunk
}

}  // namespace
}  // namespace gpubox::table::server
