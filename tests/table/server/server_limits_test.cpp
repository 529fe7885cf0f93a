// What gpubox_server holds against a hostile or careless peer (issue 30), end to end on
// loopback: SAVE/LOAD racing a folder swapped for a link stay inside data_dir, SAVE of data_dir
// itself is named as such, row creation stops at the memory limit, and no add or apply stores a
// non-finite value (DENSE, geo deltas, gradients).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdio.h>
#include <unistd.h>

#include <atomic>
#include <cfloat>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include "table/server/memory_limit.hpp"
#include "table/server/ps_protocol.hpp"
#include "table/sparse_row/optimizer.hpp"
#include "table/sparse_table.hpp"
#include "tests/common/folder_bytes.hpp"
#include "tests/table/server/fake_host_tier.hpp"
#include "tests/table/server/server_test_util.hpp"

namespace gpubox::table::server {
namespace {

using namespace testing;  // NOLINT: FakeHostTier and the loopback helpers
namespace fs = std::filesystem;
using gpubox::testing::folder_tree;

std::unique_ptr<SparseTable> sparse_table(uint32_t shards = 4) {
  HostTableConfig cfg;
  cfg.shards = shards;
  auto table = SparseTable::open(test_config(), cfg);
  EXPECT_TRUE(table.ok()) << table.status().to_string();
  return std::move(table).value();
}

// The probe, as a test: a local user keeps exchanging data_dir/d (a folder) with a link
// to a folder outside while trainers SAVE and LOAD "d/m". Outside there is an older save (which
// a save through the link would replace) and a stale staging folder (which it would delete).
TEST(ServerLimits, SavesRacingAFolderSwappedForALinkNeverLeaveDataDir) {
  TempDir dir("save_race");
  const fs::path data = dir.path() / "data", outside = dir.path() / "outside";
  fs::create_directories(data / "d");
  auto victim = sparse_table();
  std::vector<uint64_t> keys{1, 2, 3, 4, 5, 6, 7, 8};
  std::vector<float> rows(keys.size() * victim->layout().stride());
  ASSERT_TRUE(victim->pull(keys.data(), nullptr, keys.size(), rows.data(), nullptr).ok());
  ASSERT_TRUE(victim->save((outside / "m").string(), SaveKind::kBase).ok());
  fs::create_directories(outside / "m.tmp");
  std::ofstream(outside / "m.tmp" / "keep") << "keep";
  fs::create_symlink(outside, data / "d_link");
  const auto before = folder_tree(outside);

  auto table = sparse_table();
  ServerOptions so;
  so.data_dir = data.string();
  auto server = start_server(table.get(), so);
  ASSERT_TRUE(server);
  auto client = connect_client(client_options(server->endpoint()));
  ASSERT_TRUE(client);
  ASSERT_TRUE(client->pull(keys.data(), nullptr, 3, rows.data(), nullptr).ok());

  std::atomic<bool> stop{false};
  std::thread swapper([&] {
    const std::string a = (data / "d").string(), b = (data / "d_link").string();
    while (!stop.load()) ::renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE);
  });
  int saved = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  int tries = 0;
  for (; tries < 400 && std::chrono::steady_clock::now() < until; ++tries) {
    if (client->save("d/m", SaveKind::kBase).ok()) ++saved;
    (void)client->load("d/m");
  }
  stop.store(true);
  swapper.join();
  std::printf("%d of %d saves landed inside data_dir\n", saved, tries);
  EXPECT_EQ(folder_tree(outside), before) << "a save or load reached outside data_dir";
}

TEST(ServerLimits, SaveOfDataDirItselfSaysSo) {
  FakeHostTier table(test_config());
  TempDir dir("save_dot");
  ServerOptions so;
  so.data_dir = dir.path().string();
  auto server = start_server(&table, so);
  ASSERT_TRUE(server);
  auto client = connect_client(client_options(server->endpoint()));
  ASSERT_TRUE(client);
  for (const std::string& path : {std::string("."), dir.path().string()}) {
    const Status st = client->save(path, SaveKind::kBase);
    ASSERT_FALSE(st.ok()) << path;
    EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << st.to_string();
    EXPECT_NE(st.message().find("names the server's --data_dir itself"), std::string::npos)
        << st.to_string();
    EXPECT_EQ(st.message().find("outside"), std::string::npos) << st.to_string();
  }
}

// Which limit is in force, and whether it is the default: gpubox_server makes a given limit the
// disk tier's budget, never the default (half the machine: a byte budget reserves the table's
// whole planned index when it opens).
TEST(ServerLimits, OnlyTheLimitNobodyGaveIsTheDefault) {
  const MemoryLimit flag = choose_memory_limit(true, 512, 1 << 20);
  EXPECT_EQ(flag.bytes, uint64_t{512} << 20);
  EXPECT_EQ(flag.source, "--memory_mb");
  EXPECT_FALSE(flag.is_default);
  const MemoryLimit config = choose_memory_limit(false, 0, 3 << 20);
  EXPECT_EQ(config.bytes, uint64_t{3} << 20);
  EXPECT_EQ(config.source, "runner.host_memory_mb");
  EXPECT_FALSE(config.is_default);
  const MemoryLimit none_given = choose_memory_limit(false, 0, 0);
  EXPECT_EQ(none_given.bytes, default_memory_limit_bytes());
  EXPECT_TRUE(none_given.is_default) << none_given.source;
}

// PULLs of ever new keys stop at the limit with a clear error; rows already held are still
// served; pushes and PS_PUSHes of new keys are refused as well. The server admits each request
// frame on its own: a call split over two connections could be refused on one while the other's
// frame, abandoned by the client, still creates rows after the call returned (the count below
// read too early, seen once under ctest -j2). One connection, one frame per call here.
TEST(ServerLimits, RowCreationStopsAtTheMemoryLimit) {
  auto table = sparse_table();
  ServerOptions so;
  so.memory_limit_bytes = std::size_t{2} << 20;
  auto server = start_server(table.get(), so);
  ASSERT_TRUE(server);
  RemoteHostTierOptions one_frame = client_options(server->endpoint());
  one_frame.connections_per_endpoint = 1;
  auto client = connect_client(one_frame);
  ASSERT_TRUE(client);
  const std::size_t stride = client->layout().stride();
  constexpr std::size_t kBatch = 500;
  std::vector<uint64_t> keys(kBatch);
  std::vector<float> rows(kBatch * stride);
  Status refused;
  uint64_t next = 1;
  for (int batch = 0; batch < 1000 && refused.ok(); ++batch) {
    for (auto& k : keys) k = next++;
    refused = client->pull(keys.data(), nullptr, kBatch, rows.data(), nullptr);
  }
  ASSERT_FALSE(refused.ok()) << "1000 batches of new keys and never refused";
  EXPECT_EQ(refused.code(), Status::Code::kResourceExhausted) << refused.to_string();
  EXPECT_NE(refused.message().find("server memory limit"), std::string::npos)
      << refused.to_string();
  EXPECT_NE(refused.message().find("rows"), std::string::npos);
  auto stats = table->stats();
  ASSERT_TRUE(stats.ok());
  // Over by at most one allocation step (a storage chunk, an index growth) of the last request.
  EXPECT_LE(stats->memory_bytes, so.memory_limit_bytes + so.memory_limit_bytes / 10);
  EXPECT_GT(stats->rows_in_memory, 1000u);
  const uint64_t held = stats->rows_in_memory;
  // Keys it holds: served and updated.
  std::vector<uint64_t> old_keys(kBatch);
  for (std::size_t i = 0; i < kBatch; ++i) old_keys[i] = i + 1;
  ASSERT_TRUE(client->pull(old_keys.data(), nullptr, kBatch, rows.data(), nullptr).ok());
  ASSERT_TRUE(client->push(old_keys.data(), kBatch, rows.data()).ok());
  // New keys by PUSH and PS_PUSH: refused as well, nothing created.
  for (auto& k : keys) k = next++;
  EXPECT_EQ(client->push(keys.data(), kBatch, rows.data()).code(),
            Status::Code::kResourceExhausted);
  std::vector<int32_t> slots(kBatch, 1);
  std::vector<float> grads(kBatch * client->layout().push_dim(), 0.0f);
  EXPECT_EQ(
      client->push_updates(PsUpdateKind::kGradient, keys.data(), slots.data(), kBatch, grads.data())
          .code(),
      Status::Code::kResourceExhausted);
  stats = table->stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->rows_in_memory, held);
}

// DENSE add of 3e38 + 3e38: refused naming the table and the value, the table unchanged.
TEST(ServerLimits, DenseAddThatWouldOverflowIsRefusedWhole) {
  FakeHostTier table(test_config());
  auto server = start_server(&table);
  ASSERT_TRUE(server);
  auto client = connect_client(client_options(server->endpoint()));
  ASSERT_TRUE(client);
  std::vector<float> values{1.0f, 3e38f, -2.0f};
  ASSERT_TRUE(client->dense(DenseAction::kRead, "net", &values).ok());
  std::vector<float> add{1.0f, 3e38f, 1.0f};
  const Status st = client->dense(DenseAction::kAdd, "net", &add);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << st.to_string();
  EXPECT_NE(st.message().find("DENSE 'net': value 1 would become inf"), std::string::npos)
      << st.to_string();
  std::vector<float> now{0, 0, 0};
  ASSERT_TRUE(client->dense(DenseAction::kRead, "net", &now).ok());
  EXPECT_EQ(now, (std::vector<float>{1.0f, 3e38f, -2.0f}));
  std::vector<float> fine{1.0f, -3e38f, 1.0f};
  ASSERT_TRUE(client->dense(DenseAction::kAdd, "net", &fine).ok());
  EXPECT_EQ(fine, (std::vector<float>{2.0f, 0.0f, -1.0f}));
}

// PS_PUSH of two keys where one's result would overflow: refused naming that key and field, and
// the other key's update not applied either. `field` is where the update lands in the row.
void expect_overflow_refused(PsUpdateKind kind, int32_t record_field, const char* field) {
  auto table = sparse_table();
  auto server = start_server(table.get());
  ASSERT_TRUE(server);
  RemoteHostTierOptions options = client_options(server->endpoint());
  options.connections_per_endpoint = 1;  // both keys in one request (one frame)
  auto client = connect_client(options);
  ASSERT_TRUE(client);
  const RowLayout layout = client->layout();
  const std::size_t dim = layout.push_dim(), stride = layout.stride();
  const std::vector<uint64_t> keys{11, 12};
  const std::vector<int32_t> slots{1, 1};
  std::vector<float> update(2 * dim, 0.0f);
  update[0 * dim + record_field] = 1.0f;   // key 11: harmless
  update[1 * dim + record_field] = 3e38f;  // key 12: 3e38 now, 6e38 after the second
  ASSERT_TRUE(client->push_updates(kind, keys.data(), slots.data(), 2, update.data()).ok());
  std::vector<float> before(2 * stride);
  ASSERT_TRUE(client->pull(keys.data(), slots.data(), 2, before.data(), nullptr).ok());
  const Status st = client->push_updates(kind, keys.data(), slots.data(), 2, update.data());
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << st.to_string();
  EXPECT_NE(st.message().find(std::string("key 12's ") + field + " would not be finite"),
            std::string::npos)
      << st.to_string();
  EXPECT_NE(st.message().find("nothing of the request's 2 keys was applied"), std::string::npos);
  std::vector<float> after(2 * stride);
  ASSERT_TRUE(client->pull(keys.data(), slots.data(), 2, after.data(), nullptr).ok());
  EXPECT_EQ(after, before) << "a refused PS_PUSH changed a row";
}

TEST(ServerLimits, GeoDeltasThatWouldOverflowAreRefusedWhole) {
  // show takes the delta's show as it is (the weights are clipped to their bounds).
  expect_overflow_refused(PsUpdateKind::kDelta, table::optimizer::PushRecord::kShow, "show");
}

TEST(ServerLimits, GradientsThatWouldOverflowAreRefusedWhole) {
  // click accumulates the pushed click as it is: the second 3e38 overflows it.
  expect_overflow_refused(PsUpdateKind::kGradient, table::optimizer::PushRecord::kClick, "click");
}

}  // namespace
}  // namespace gpubox::table::server
