// A base + delta chain saved by a gpubox_server across decaying shrinks (delta+shrinks: the
// deltas record the shrinks instead of holding every row they aged) and LOADed by another
// server over a fresh table equals the table that saved it, unseen days included, and equals the
// same chain loaded in-process. The oracle: the served table's rows (model records and unseen
// days), read in-process.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "table/sparse_table.hpp"
#include "tests/table/server/server_test_util.hpp"
#include "tests/table/server/shrink_test_util.hpp"
#include "tests/table/table_test_util.hpp"

namespace gpubox::table::server {
namespace {

using namespace testing;      // NOLINT: the loopback helpers
using namespace shrink_test;  // NOLINT: the tables, clients
using table::testing::RowMap;

// Every row's model record, then its unseen days.
RowMap saved_state(SparseTable& table) {
  RowMap out;
  const RowLayout layout = table.layout();
  for (const auto& [key, row] : table::testing::snapshot(table)) {
    std::vector<float> rec(record_floats(RecordKind::kModel, layout));
    row_to_record(RecordKind::kModel, layout, row.data(), rec.data());
    rec.push_back(row[RowLayout::kUnseenDays]);
    out[key] = rec;
  }
  return out;
}

TEST(ShrinkChain, AServersLoadOfAChainAcrossShrinksEqualsTheSavingTableAndALocalLoad) {
  AccessorConfig cfg = test_config();
  cfg.show_click_decay_rate = 0.9f;
  cfg.delete_after_unseen_days = 2.0f;
  TempDir dir("shrink_chain");
  ServerOptions so;
  so.data_dir = dir.path().string();
  std::unique_ptr<SparseTable> served = sparse_table(4, cfg);
  auto server = start_server(served.get(), so);
  ASSERT_TRUE(server);
  auto client = connect_client(bounded_client(server->endpoint(), cfg));
  ASSERT_TRUE(client);
  std::mt19937_64 rng(5);
  const auto push = [&](std::size_t n) {
    std::vector<uint64_t> keys = spread_keys(n, rng() % 1000);
    std::vector<float> rows;
    for (std::size_t i = 0; i < n; ++i) {
      const auto row = table::testing::random_row(rng, served->layout());
      rows.insert(rows.end(), row.begin(), row.end());
    }
    ASSERT_TRUE(client->push(keys.data(), n, rows.data()).ok());
  };
  push(300);
  ASSERT_TRUE(client->save("base", SaveKind::kBase).ok());
  ASSERT_TRUE(client->shrink().ok());
  push(40);
  ASSERT_TRUE(client->save("delta1", SaveKind::kDelta).ok());
  for (int day = 0; day < 2; ++day) ASSERT_TRUE(client->shrink().ok());  // the base's rows go
  push(30);
  ASSERT_TRUE(client->save("delta2", SaveKind::kDelta).ok());
  const RowMap want = saved_state(*served);
  ASSERT_GT(want.size(), 0u);

  std::unique_ptr<SparseTable> loaded = sparse_table(3, cfg);
  auto loading_server = start_server(loaded.get(), so);
  ASSERT_TRUE(loading_server);
  auto loading_client = connect_client(bounded_client(loading_server->endpoint(), cfg));
  ASSERT_TRUE(loading_client);
  for (const char* save : {"base", "delta1", "delta2"}) {
    const Status st = loading_client->load(save);
    ASSERT_TRUE(st.ok()) << save << ": " << st.to_string();
  }
  EXPECT_TRUE(table::testing::same_rows(saved_state(*loaded), want));

  std::unique_ptr<SparseTable> local = sparse_table(4, cfg);
  for (const char* save : {"base", "delta1", "delta2"}) {
    const Status st = local->load((dir.path() / save).string());
    ASSERT_TRUE(st.ok()) << save << ": " << st.to_string();
  }
  EXPECT_TRUE(table::testing::same_rows(saved_state(*local), want));
}

}  // namespace
}  // namespace gpubox::table::server
