// SAVE and LOAD longer than the client's bound (issue 32): the server runs them off its network
// threads and sends PROGRESS frames while they move, and the client bounds each server's share by
// the time without progress (RemoteHostTierOptions::deadline_s, runner.server_timeout_s), not by
// the call's total time. A save and a load that take several bounds complete and load back what
// was saved; one that stops moving is reported within about the bound, naming its server, also
// while another server keeps moving (each server has its own bound); PROGRESS frames never reach
// a client that did not wait for one, and the server refuses one from a client.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "table/server/bulk_work.hpp"
#include "table/sparse_table.hpp"
#include "tests/table/forwarding_host_tier.hpp"
#include "tests/table/server/server_test_util.hpp"
#include "tests/table/server/slow_io_tier.hpp"

namespace gpubox::table::server {
namespace {

using namespace testing;  // NOLINT: the loopback helpers
using std::chrono::milliseconds;

// The client's bound without progress: well over a loaded machine's stalls (a healthy save that
// goes quiet this long is given up on), as in shrink_test_util.hpp.
constexpr double kBoundS = 3.0;
// Each file operation of a slowed save or load: well under the bound, so that a call moves.
constexpr milliseconds kOpDelay{400};

std::unique_ptr<SparseTable> sparse_table() {
  HostTableConfig cfg;
  cfg.shards = 4;
  auto table = SparseTable::open(test_config(), cfg);
  EXPECT_TRUE(table.ok()) << table.status().to_string();
  return std::move(table).value();
}

ServerOptions progress_options(const std::filesystem::path& data_dir) {
  ServerOptions so;
  so.data_dir = data_dir.string();
  so.progress_interval_s = 0.1;
  return so;
}

RemoteHostTierOptions bounded_client(const std::string& endpoints) {
  RemoteHostTierOptions o = client_options(endpoints);
  o.deadline_s = kBoundS;
  return o;
}

// Lets a held tier go at the end of a scope (before its server, declared earlier, waits for its
// worker), also when an assertion left the test early.
struct ReleaseAtEnd {
  SlowIoTier& tier;
  ~ReleaseAtEnd() { tier.release(); }
};

// Lets a held tier go after `after`, in case an implementation kept a stuck call alive: the
// call then ends well, and the test fails on its status instead of hanging.
class Watchdog {
 public:
  Watchdog(SlowIoTier& tier, std::chrono::seconds after)
      : thread_([&tier, after, this] {
          const auto until = std::chrono::steady_clock::now() + after;
          while (!done_.load() && std::chrono::steady_clock::now() < until) {
            std::this_thread::sleep_for(milliseconds(20));
          }
          tier.release();
        }) {}
  ~Watchdog() {
    done_.store(true);
    thread_.join();
  }

 private:
  std::atomic<bool> done_{false};
  std::thread thread_;
};

// A server over a table whose next file operation holds (`how`) until it is let go: at the end
// of the scope (before the server waits for its worker) or by a watchdog after `watchdog_after`.
struct HeldServer {
  HeldServer(const char* name, SlowIoTier::Hold how,
             std::chrono::seconds watchdog_after = std::chrono::seconds(120))
      : dir(name),
        table(sparse_table()),
        held(*table, milliseconds(0)),
        server(start_server(&held, progress_options(dir.path()))) {
    held.hold_at(held.ops() + 1, how);
    watchdog.emplace(held, watchdog_after);
  }
  TempDir dir;
  std::unique_ptr<SparseTable> table;
  SlowIoTier held;
  std::unique_ptr<Server> server;
  ReleaseAtEnd release{held};
  std::optional<Watchdog> watchdog;
};

std::vector<float> pull_rows(HostTier& tier, const std::vector<uint64_t>& keys) {
  std::vector<float> rows(keys.size() * tier.layout().stride());
  EXPECT_TRUE(tier.pull(keys.data(), nullptr, keys.size(), rows.data(), nullptr).ok());
  return rows;
}

TEST(ServerProgress, SaveAndLoadLongerThanTheBoundCompleteAndLoadBack) {
  TempDir dir("progress_slow");
  auto table = sparse_table();
  SlowIoTier slow(*table, kOpDelay);
  auto server = start_server(&slow, progress_options(dir.path()));
  ASSERT_TRUE(server);
  ReleaseAtEnd release{slow};
  auto client = connect_client(bounded_client(server->endpoint()));
  ASSERT_TRUE(client);
  std::vector<uint64_t> keys(300);
  for (std::size_t i = 0; i < keys.size(); ++i) keys[i] = 1000 + 7 * i;
  const std::vector<float> saved = pull_rows(*client, keys);

  const int64_t before_save = slow.ops();
  const Status save = client->save("m", SaveKind::kCheckpoint);  // full rows: loaded back equal
  ASSERT_TRUE(save.ok()) << save.to_string();
  const int64_t save_ops = slow.ops() - before_save;
  // The save spent at least this long in its slowed operations alone (they take turns).
  const double save_s = static_cast<double>(save_ops) * kOpDelay.count() / 1000.0;
  std::printf("SAVE: %lld slowed file operations, at least %.2f s, bound %.1f s\n",
              static_cast<long long>(save_ops), save_s, kBoundS);
  EXPECT_GE(save_s, 2 * kBoundS);

  // Gone after the save; the load brings the saved rows back.
  ASSERT_TRUE(client->erase(keys.data(), keys.size()).ok());
  const int64_t before_load = slow.ops();
  const Status load = client->load("m");
  ASSERT_TRUE(load.ok()) << load.to_string();
  const double load_s = static_cast<double>(slow.ops() - before_load) * kOpDelay.count() / 1000.0;
  std::printf("LOAD: at least %.2f s, bound %.1f s\n", load_s, kBoundS);
  EXPECT_GE(load_s, 2 * kBoundS);
  const std::vector<float> loaded = pull_rows(*client, keys);
  EXPECT_EQ(loaded, saved);
}

// A save that stops moving (held before a file operation, as a server stuck in its own code or
// stopped would be): DeadlineExceeded naming the server, long before the watchdog would let the
// save go on. The server itself stays usable: its network threads never ran the save.
TEST(ServerProgress, SaveThatStopsMovingIsReportedNamingTheServer) {
  TempDir dir("progress_stuck");
  auto table = sparse_table();
  SlowIoTier stuck(*table, milliseconds(0));
  auto server = start_server(&stuck, progress_options(dir.path()));
  ASSERT_TRUE(server);
  ReleaseAtEnd release{stuck};
  auto client = connect_client(bounded_client(server->endpoint()));
  ASSERT_TRUE(client);
  const std::vector<uint64_t> keys{1, 2, 3};
  (void)pull_rows(*client, keys);
  stuck.hold_at(stuck.ops() + 2, SlowIoTier::Hold::kStopped);
  Watchdog watchdog(stuck, std::chrono::seconds(60));
  const auto start = std::chrono::steady_clock::now();
  const Status st = client->save("m", SaveKind::kBase);
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("stuck SAVE reported after %.2f s (bound %.1f s): %s\n", took, kBoundS,
              st.to_string().c_str());
  EXPECT_EQ(st.code(), Status::Code::kDeadlineExceeded) << st.to_string();
  EXPECT_NE(st.message().find("SAVE to " + server->endpoint()), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("no progress reported for"), std::string::npos) << st.message();
  EXPECT_TRUE(stuck.holding());
  // Other calls are served meanwhile.
  EXPECT_TRUE(client->stats().ok());
}

// Two servers: one keeps moving for as long as the test wants, the other stops. The call names
// the one that stopped while the other still moves: each server has its own bound, which the
// other's progress does not extend.
TEST(ServerProgress, OneServerMovingDoesNotHideAnotherThatStopped) {
  TempDir dir_a("progress_moving"), dir_b("progress_stopped");
  auto table_a = sparse_table();
  auto table_b = sparse_table();
  SlowIoTier moving(*table_a, milliseconds(0));
  SlowIoTier stopped(*table_b, milliseconds(0));
  ServerOptions options_a = progress_options(dir_a.path()),
                options_b = progress_options(dir_b.path());
  options_a.shard_num = options_b.shard_num = 2;  // shards 0 and 1 of the list
  options_b.shard_id = 1;
  auto a = start_server(&moving, options_a);
  auto b = start_server(&stopped, options_b);
  ASSERT_TRUE(a && b);
  ReleaseAtEnd release_a{moving}, release_b{stopped};
  auto client = connect_client(bounded_client(a->endpoint() + "," + b->endpoint()));
  ASSERT_TRUE(client);
  moving.hold_at(moving.ops() + 1, SlowIoTier::Hold::kMoving);
  stopped.hold_at(stopped.ops() + 1, SlowIoTier::Hold::kStopped);
  Watchdog watch_a(moving, std::chrono::seconds(60)), watch_b(stopped, std::chrono::seconds(60));
  const Status st = client->save("m", SaveKind::kBase);
  EXPECT_EQ(st.code(), Status::Code::kDeadlineExceeded) << st.to_string();
  EXPECT_NE(st.message().find("SAVE to " + b->endpoint()), std::string::npos) << st.message();
  EXPECT_TRUE(moving.holding()) << "the moving server's save was not still running";
}

// A PROGRESS frame from a client is refused: the server closes the connection.
TEST(ServerProgress, ServerClosesAConnectionThatSendsProgress) {
  auto table = sparse_table();
  auto server = start_server(table.get());
  ASSERT_TRUE(server);
  auto conn = Connection::open(Endpoint{"127.0.0.1", server->port()},
                               Clock::now() + std::chrono::seconds(5));
  ASSERT_TRUE(conn.ok()) << conn.status().to_string();
  FrameHeader h;
  h.op = Op::kProgress;
  h.request_id = 3;
  h.client_id = 9;
  std::vector<uint8_t> payload;
  encode_progress(ProgressNote{1, 2}, &payload);
  auto reply =
      conn->call(h, payload, kDefaultMaxPayloadBytes, Clock::now() + std::chrono::seconds(10));
  ASSERT_FALSE(reply.ok());
  EXPECT_EQ(reply.status().code(), Status::Code::kUnavailable) << reply.status().to_string();
  EXPECT_GE(server->counters().protocol_errors, 1u);
}

// ---- the worker's limits: abandoned calls, caps, failures, retries (h154 review) ----

std::vector<uint8_t> save_payload(const std::string& path) {
  std::vector<uint8_t> payload;
  encode_save_request(SaveKind::kBase, path, &payload);
  return payload;
}

FrameHeader save_header(uint64_t client_id, uint64_t request_id) {
  FrameHeader h;
  h.op = Op::kSave;
  h.client_id = client_id;
  h.request_id = request_id;
  return h;
}

std::unique_ptr<Connection> open_conn(const Server& server) {
  auto conn = Connection::open(Endpoint{"127.0.0.1", server.port()},
                               Clock::now() + std::chrono::seconds(10));
  EXPECT_TRUE(conn.ok()) << conn.status().to_string();
  if (!conn.ok()) return nullptr;
  return std::make_unique<Connection>(std::move(*conn));
}

// Sends a SAVE and does not wait for its reply.
void send_save(Connection& conn, uint64_t client_id, uint64_t request_id) {
  const std::vector<uint8_t> frame =
      encode_frame(save_header(client_id, request_id), save_payload("m"));
  ASSERT_TRUE(
      conn.send_all(frame.data(), frame.size(), Clock::now() + std::chrono::seconds(10)).ok());
}

StatusOr<std::vector<uint8_t>> call_save(Connection& conn, uint64_t client_id, uint64_t request_id,
                                         double deadline_s = 60) {
  return conn.call(save_header(client_id, request_id), save_payload("m"), kDefaultMaxPayloadBytes,
                   Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                      std::chrono::duration<double>(deadline_s)));
}

// Waits (up to a minute, so that a failure does not hang) until `done` holds.
template <typename F>
bool eventually(F done) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!done()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(milliseconds(10));
  }
  return true;
}

// Clients that send a SAVE and leave, again and again, while one runs: the worker holds at most
// 16 calls (one per client id), refuses the rest "server busy", and drops those whose client left
// before they started (they never run, and hold no slot), so a trainer's SAVE afterwards runs at
// once.
TEST(ServerProgress, AbandonedSavesAreCappedAndDropped) {
  HeldServer h("progress_abandoned", SlowIoTier::Hold::kStopped);
  ASSERT_TRUE(h.server);
  SlowIoTier& held = h.held;
  std::unique_ptr<Server>& server = h.server;
  constexpr std::size_t kConns = 24;
  std::vector<std::unique_ptr<Connection>> conns;
  // One at a time, each admitted or refused before the next is sent: the server reads its
  // connections in no set order, so 24 sent at once could be refused in any 8 of them.
  for (std::size_t i = 0; i < kConns; ++i) {
    conns.push_back(open_conn(*server));
    ASSERT_TRUE(conns.back());
    send_save(*conns.back(), 100 + i, 1);
    const auto admitted_or_refused = [&] {
      const ServerCounters c = server->counters();
      return c.bulk_queued + c.bulk_busy == i + 1;
    };
    ASSERT_TRUE(eventually(admitted_or_refused)) << "SAVE " << i << " neither queued nor refused";
    if (i == 0) {
      ASSERT_TRUE(eventually([&] { return held.holding(); }));
    }
  }
  // 16 queued (the first of them running), the rest refused at once.
  EXPECT_EQ(server->counters().bulk_queued, 16u);
  EXPECT_EQ(server->counters().bulk_busy, kConns - 16);
  for (std::size_t i = 16; i < kConns; ++i) {
    Frame reply;
    ASSERT_TRUE(
        conns[i]
            ->recv_frame(&reply, kDefaultMaxPayloadBytes, Clock::now() + std::chrono::seconds(30))
            .ok());
    const Status st = decode_error_reply(reply.header, reply.payload.data(), reply.payload.size());
    EXPECT_EQ(st.code(), Status::Code::kAborted) << st.to_string();
    EXPECT_NE(st.message().find("server busy"), std::string::npos) << st.message();
  }
  EXPECT_EQ(server->counters().bulk_busy, kConns - 16);
  // Every client leaves; the queued calls are dropped without running.
  conns.clear();
  ASSERT_TRUE(eventually([&] { return server->counters().bulk_skipped == 15; }))
      << server->counters().bulk_skipped;
  // The slots are free: a trainer's SAVE is queued (not refused) while the held one still runs.
  auto trainer = open_conn(*server);
  ASSERT_TRUE(trainer);
  send_save(*trainer, 7, 1);
  EXPECT_TRUE(held.holding());
  held.release();
  Frame reply;
  ASSERT_TRUE(
      trainer->recv_frame(&reply, kDefaultMaxPayloadBytes, Clock::now() + std::chrono::seconds(60))
          .ok());
  while (is_progress(reply.header)) {
    ASSERT_TRUE(
        trainer
            ->recv_frame(&reply, kDefaultMaxPayloadBytes, Clock::now() + std::chrono::seconds(60))
            .ok());
  }
  const Status st = decode_error_reply(reply.header, reply.payload.data(), reply.payload.size());
  EXPECT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(server->counters().bulk_runs, 2u);  // the held one and the trainer's
  EXPECT_EQ(server->counters().bulk_skipped, 15u);
}

// One client's second SAVE (another request) while its first runs is queued behind it (a
// recovery's reload after a SAVE given up on); a third while the second waits is refused "server
// busy"; a SAVE or LOAD request over 64 KiB is refused from its header.
TEST(ServerProgress, OneCallPerClientAndSmallRequests) {
  HeldServer h("progress_per_client", SlowIoTier::Hold::kStopped);
  ASSERT_TRUE(h.server);
  SlowIoTier& held = h.held;
  std::unique_ptr<Server>& server = h.server;
  auto first = open_conn(*server);
  auto second = open_conn(*server);
  auto third = open_conn(*server);
  ASSERT_TRUE(first && second && third);
  send_save(*first, 42, 1);
  ASSERT_TRUE(eventually([&] { return held.holding(); }));
  // Whichever of the two the server admits first is queued, the other refused.
  send_save(*second, 42, 2);
  send_save(*third, 42, 3);
  ASSERT_TRUE(eventually([&] { return server->counters().bulk_busy == 1; }));
  held.release();
  std::vector<Status::Code> codes;
  for (Connection* conn : {second.get(), third.get()}) {
    Frame reply;
    do {
      ASSERT_TRUE(
          conn->recv_frame(&reply, kDefaultMaxPayloadBytes, Clock::now() + std::chrono::seconds(60))
              .ok());
    } while (is_progress(reply.header));
    codes.push_back(reply.header.status);
  }
  EXPECT_EQ(std::count(codes.begin(), codes.end(), Status::Code::kOk), 1);
  EXPECT_EQ(std::count(codes.begin(), codes.end(), Status::Code::kAborted), 1);
  ASSERT_TRUE(eventually([&] { return server->counters().bulk_runs == 2; }));

  auto big = open_conn(*server);
  ASSERT_TRUE(big);
  std::vector<uint8_t> payload = save_payload("m");
  payload.resize(64 * 1024 + 1);
  const auto refused = big->call(save_header(43, 1), payload, kDefaultMaxPayloadBytes,
                                 Clock::now() + std::chrono::seconds(30));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), Status::Code::kInvalidArgument)
      << refused.status().to_string();
}

// A SAVE retried on a new connection while the first still runs (its client gave up on the first
// connection) waits for the first's reply: the save runs once.
TEST(ServerProgress, RetriedSaveWhileTheFirstRunsRunsOnce) {
  HeldServer h("progress_retry", SlowIoTier::Hold::kMoving);
  ASSERT_TRUE(h.server);
  SlowIoTier& held = h.held;
  std::unique_ptr<Server>& server = h.server;
  auto first = open_conn(*server);
  ASSERT_TRUE(first);
  send_save(*first, 77, 5);
  ASSERT_TRUE(eventually([&] { return held.holding(); }));
  first.reset();  // the client gave up mid-SAVE: the save goes on
  auto retry = open_conn(*server);
  ASSERT_TRUE(retry);
  std::thread releaser([&] {
    // Once the retry waits for it, the held save may end.
    (void)eventually([&] { return server->counters().bulk_attached == 1; });
    held.release();
  });
  const auto reply = call_save(*retry, 77, 5);
  releaser.join();
  EXPECT_TRUE(reply.ok()) << reply.status().to_string();
  EXPECT_EQ(server->counters().bulk_attached, 1u);
  EXPECT_EQ(server->counters().bulk_runs, 1u);
}

// A tier whose saves throw: first std::runtime_error, then std::bad_alloc, then they work.
class ThrowingTier final : public table::testing::ForwardingHostTier {
 public:
  explicit ThrowingTier(HostTier& inner) : ForwardingHostTier(inner) {}
  using HostTier::load;
  using HostTier::save;
  Status save(const std::string& path, SaveKind mode, io::FileEnv* env) override {
    const int call = calls_++;
    if (call == 0) throw std::runtime_error("a table bug");
    if (call == 1) throw std::bad_alloc();
    return inner().save(path, mode, env);
  }

 private:
  std::atomic<int> calls_{0};
};

// A SAVE whose table call throws is answered with an error naming it (the server goes on), and
// its retry (same request) runs again instead of being answered "still being applied" forever.
TEST(ServerProgress, SaveThatThrowsIsAnsweredAndItsRetryRuns) {
  TempDir dir("progress_throw");
  auto table = sparse_table();
  ThrowingTier throwing(*table);
  auto server = start_server(&throwing, progress_options(dir.path()));
  ASSERT_TRUE(server);
  auto conn = open_conn(*server);
  ASSERT_TRUE(conn);
  const auto first = call_save(*conn, 11, 3);
  ASSERT_FALSE(first.ok());
  EXPECT_EQ(first.status().code(), Status::Code::kInternal) << first.status().to_string();
  EXPECT_NE(first.status().message().find("a table bug"), std::string::npos)
      << first.status().to_string();
  const auto second = call_save(*conn, 11, 3);  // the retry: bad_alloc this time
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), Status::Code::kInternal) << second.status().to_string();
  const auto third = call_save(*conn, 11, 3);
  EXPECT_TRUE(third.ok()) << third.status().to_string();
  EXPECT_EQ(server->counters().bulk_runs, 3u);
}

// A request pipelined behind a SAVE on the same connection is answered after it (the session's
// watch for a closing client leaves its bytes alone).
TEST(ServerProgress, ARequestPipelinedBehindASaveIsAnswered) {
  HeldServer h("progress_pipelined", SlowIoTier::Hold::kStopped);
  ASSERT_TRUE(h.server);
  SlowIoTier& held = h.held;
  std::unique_ptr<Server>& server = h.server;
  auto conn = open_conn(*server);
  ASSERT_TRUE(conn);
  send_save(*conn, 55, 1);
  ASSERT_TRUE(eventually([&] { return held.holding(); }));
  FrameHeader stats;
  stats.op = Op::kStats;
  stats.client_id = 55;
  stats.request_id = 2;
  const std::vector<uint8_t> frame = encode_frame(stats, {});
  ASSERT_TRUE(
      conn->send_all(frame.data(), frame.size(), Clock::now() + std::chrono::seconds(10)).ok());
  held.release();
  std::vector<uint64_t> answered;
  while (answered.size() < 2) {
    Frame reply;
    ASSERT_TRUE(
        conn->recv_frame(&reply, kDefaultMaxPayloadBytes, Clock::now() + std::chrono::seconds(60))
            .ok());
    if (is_progress(reply.header)) continue;
    EXPECT_EQ(reply.header.status, Status::Code::kOk);
    answered.push_back(reply.header.request_id);
  }
  EXPECT_EQ(answered, (std::vector<uint64_t>{1, 2}));
}

// A server that answers a bounded SAVE "server busy" (its worker full of other clients' calls)
// for longer than the bound: the SAVE is given up on (a busy answer is no progress), instead of
// being retried for as long as the others run.
TEST(ServerProgress, BusyForLongerThanTheBoundIsGivenUpOn) {
  TempDir dir("progress_busy");
  auto table = sparse_table();
  SlowIoTier held(*table, milliseconds(0));
  auto server = start_server(&held, progress_options(dir.path()));
  ASSERT_TRUE(server);
  ReleaseAtEnd release{held};
  auto client = connect_client(bounded_client(server->endpoint()));
  ASSERT_TRUE(client);
  held.hold_at(held.ops() + 1, SlowIoTier::Hold::kStopped);
  Watchdog watchdog(held, std::chrono::seconds(30));
  const uint64_t queued = server->counters().bulk_queued;
  std::vector<std::unique_ptr<Connection>> others;  // 16 other clients fill the worker
  for (uint64_t i = 0; i < 16; ++i) {               // the worker's cap (BulkWorker::kMaxJobs)
    others.push_back(open_conn(*server));
    ASSERT_TRUE(others.back());
    send_save(*others.back(), 1000 + i, 1);
  }
  // Queued, not only read: a request counted but not yet submitted could leave a slot to the
  // client's own SAVE.
  ASSERT_TRUE(eventually([&] { return server->counters().bulk_queued >= queued + 16; }));
  const Status st = client->save("m", SaveKind::kBase);
  EXPECT_EQ(st.code(), Status::Code::kDeadlineExceeded) << st.to_string();
  EXPECT_NE(st.message().find("server busy"), std::string::npos) << st.message();
  EXPECT_TRUE(held.holding()) << "the SAVE waited until the others ran";
  EXPECT_GE(server->counters().bulk_busy, 1u);
}

}  // namespace
}  // namespace gpubox::table::server
