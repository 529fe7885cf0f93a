// gpubox_server's shutdown with a SAVE running on its worker thread (issue 32,
// table/server/bulk_work.hpp), and a worker thread that cannot be started.
//
// What a shutdown does (Server::stop, then Server::wait, as SIGTERM or SHUTDOWN do): the network
// threads end at once; wait() lets the SAVE under way finish before it returns (the table is the
// caller's after wait()), so the save's folder is complete and loads back what was saved; its
// client's call fails (the reply is lost with the server), which tells the trainer to save again.
// wait() returns once the SAVE ended: it never hangs on a finished worker.
//
// A worker thread that cannot be started (std::thread throws std::system_error: the process is out
// of threads) fails Server::start with an Internal status naming the worker, at once.
#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "table/io/save_dir.hpp"
#include "table/sparse_table.hpp"
#include "tests/table/server/server_test_util.hpp"
#include "tests/table/server/slow_io_tier.hpp"

namespace gpubox::table::server {
namespace {

using namespace testing;  // NOLINT: the loopback helpers
using std::chrono::milliseconds;

std::unique_ptr<SparseTable> sparse_table() {
  HostTableConfig cfg;
  cfg.shards = 4;
  auto table = SparseTable::open(test_config(), cfg);
  EXPECT_TRUE(table.ok()) << table.status().to_string();
  return std::move(table).value();
}

std::vector<float> pull_rows(HostTier& tier, const std::vector<uint64_t>& keys) {
  std::vector<float> rows(keys.size() * tier.layout().stride());
  EXPECT_TRUE(tier.pull(keys.data(), nullptr, keys.size(), rows.data(), nullptr).ok());
  return rows;
}

TEST(ServerShutdown, ASaveRunningOnTheWorkerIsFinishedAndItsClientFails) {
  TempDir dir("shutdown_saving");
  auto table = sparse_table();
  SlowIoTier held(*table, milliseconds(0));
  ServerOptions options;
  options.data_dir = dir.path().string();
  options.progress_interval_s = 0.1;
  std::atomic<bool> stopping_worker{false};  // wait() reached the worker, the SAVE under way
  options.stopping_worker_hook = [&] { stopping_worker = true; };
  auto server = start_server(&held, options);
  ASSERT_TRUE(server);
  RemoteHostTierOptions client_opts = client_options(server->endpoint());
  // The SAVE's bound without progress: the stopped server sends none, so the client gives up
  // after it (or sooner, when it finds the connection closed).
  client_opts.deadline_s = 3;
  auto client = connect_client(client_opts);
  ASSERT_TRUE(client);
  std::vector<uint64_t> keys(300);
  for (std::size_t i = 0; i < keys.size(); ++i) keys[i] = 1000 + 7 * i;
  const std::vector<float> saved = pull_rows(*client, keys);

  // The SAVE holds (moving, as a long write would) in its first file operation.
  held.hold_at(held.ops(), SlowIoTier::Hold::kMoving);
  Status save_status;
  std::thread saving([&] { save_status = client->save("m", SaveKind::kCheckpoint); });
  ASSERT_TRUE(eventually([&] { return held.holding(); }, 60.0));

  server->stop();
  std::atomic<bool> waited{false};
  std::thread waiting([&] {
    server->wait();
    waited = true;
  });
  // wait() does not return while the SAVE is under way: it is finished first.
  EXPECT_TRUE(eventually([&] { return stopping_worker.load(); }, 60.0));
  EXPECT_FALSE(waited.load());
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "m" / io::kManifestName));
  held.release();
  waiting.join();
  saving.join();
  EXPECT_TRUE(waited.load());
  // The reply was lost with the server: the trainer's save fails, and is redone.
  EXPECT_FALSE(save_status.ok());
  std::printf("the client's SAVE: %s\n", save_status.to_string().c_str());

  // The save's folder is complete: a fresh table loads it back, rows equal.
  ASSERT_TRUE(std::filesystem::exists(dir.path() / "m" / io::kManifestName));
  auto fresh = sparse_table();
  ASSERT_TRUE(fresh->load((dir.path() / "m").string()).ok());
  EXPECT_EQ(pull_rows(*fresh, keys), saved);
}

TEST(ServerShutdown, AWorkerThreadThatCannotStartFailsTheServerStartNamingIt) {
  TempDir dir("shutdown_no_worker");
  auto table = sparse_table();
  ServerOptions options;
  options.data_dir = dir.path().string();
  options.worker_start_fault = [] {
    throw std::system_error(EAGAIN, std::generic_category(), "thread creation refused");
  };
  StatusOr<std::unique_ptr<Server>> server = Server::start(table.get(), options);
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), Status::Code::kInternal);
  EXPECT_NE(server.status().to_string().find("cannot start the SAVE/LOAD worker thread"),
            std::string::npos)
      << server.status().to_string();
}

}  // namespace
}  // namespace gpubox::table::server
