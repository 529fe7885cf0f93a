// SHRINK is not idempotent (twice ages a day twice), so the server's worker runs a request once:
// a SHRINK retried on a new connection while the first still runs waits for the first's reply
// (one run, the rows decayed once), and a SHRINK behind the same client's queued SAVE is refused
// "server busy" (the client retries it), not queued twice.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "table/server/connection.hpp"
#include "table/server/protocol.hpp"
#include "table/sparse_table.hpp"
#include "tests/table/server/server_test_util.hpp"
#include "tests/table/server/shrink_test_util.hpp"
#include "tests/table/table_test_util.hpp"

namespace gpubox::table::server {
namespace {

using namespace testing;      // NOLINT: the loopback helpers
using namespace shrink_test;  // NOLINT: the slowed tier, tables, servers

FrameHeader request_header(Op op, uint64_t client_id, uint64_t request_id) {
  FrameHeader h;
  h.op = op;
  h.client_id = client_id;
  h.request_id = request_id;
  return h;
}

void send_request(Connection& conn, const FrameHeader& h, const std::vector<uint8_t>& payload) {
  const std::vector<uint8_t> frame = encode_frame(h, payload);
  ASSERT_TRUE(conn.send_all(frame.data(), frame.size(), seconds_from_now(10)).ok());
}

// The reply to the request on `conn` (PROGRESS frames skipped), within a minute in all.
Frame reply_of(Connection& conn) {
  const Clock::time_point deadline = seconds_from_now(60);
  Frame reply;
  do {
    const Status st = conn.recv_frame(&reply, kDefaultMaxPayloadBytes, deadline);
    EXPECT_TRUE(st.ok()) << st.to_string();
    if (!st.ok()) return reply;
  } while (is_progress(reply.header));
  return reply;
}

// The first SHRINK's connection closes while it runs (held, moving); the same request on a new
// connection attaches to it and gets its reply: the table aged one day, each row decayed once.
TEST(ShrinkDedupe, ARetryWhileTheFirstRunsAttachesAndAgesOnce) {
  const AccessorConfig cfg = test_config();
  HeldShrinkServer held(4, cfg);
  ASSERT_TRUE(held.server);
  const std::vector<uint64_t> keys = spread_keys(40, 7);
  std::mt19937_64 rng(31);
  std::vector<float> rows;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    std::vector<float> row = table::testing::random_row(rng, held.table->layout());
    rows.insert(rows.end(), row.begin(), row.end());
  }
  ASSERT_TRUE(held.table->push(keys.data(), keys.size(), rows.data()).ok());

  held.tier.hold_at(1, SlowShrinkTier::Hold::kMoving);
  const FrameHeader shrink = request_header(Op::kShrink, 4, 9);
  auto first = std::make_unique<Connection>(raw_connection(held.server->port()));
  send_request(*first, shrink, {});
  ASSERT_TRUE(eventually([&] { return held.tier.holding(); }, 60.0));
  first.reset();  // the client gave up on this connection: the shrink goes on
  Connection retry = raw_connection(held.server->port());
  send_request(retry, shrink, {});
  ASSERT_TRUE(eventually([&] { return held.server->counters().bulk_attached == 1; }, 60.0));
  held.tier.release();
  const Frame reply = reply_of(retry);
  EXPECT_EQ(reply.header.status, Status::Code::kOk);
  auto deleted = decode_u64_reply(reply.payload.data(), reply.payload.size());
  ASSERT_TRUE(deleted.ok()) << deleted.status().to_string();
  EXPECT_EQ(*deleted, 0u);  // test_config keeps every row
  EXPECT_EQ(held.server->counters().bulk_attached, 1u);
  EXPECT_EQ(held.server->counters().bulk_runs, 1u);
  EXPECT_EQ(held.table->day(), 1);
  std::vector<float> peeked(rows.size());
  std::size_t unknown = 0;
  ASSERT_TRUE(held.table->peek(keys.data(), nullptr, keys.size(), peeked.data(), &unknown).ok());
  ASSERT_EQ(unknown, 0u);
  const std::size_t stride = held.table->layout().stride();
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const float* row = &peeked[i * stride];
    EXPECT_FLOAT_EQ(row[RowLayout::kShow],
                    rows[i * stride + RowLayout::kShow] * cfg.show_click_decay_rate)
        << "key " << i;
    EXPECT_EQ(row[RowLayout::kUnseenDays], 1.0f) << "key " << i;
  }
}

// Another client's SHRINK runs (held, moving); this client's SAVE is queued behind it, and this
// client's SHRINK (another request) is refused "server busy": one call of a client waits on the
// worker.
TEST(ShrinkDedupe, AShrinkBehindTheSameClientsQueuedSaveIsBusy) {
  TempDir data("shrink_dedupe_busy");
  ServerOptions options = progress_options();
  options.data_dir = data.path().string();
  HeldShrinkServer held(4, test_config(), options);
  ASSERT_TRUE(held.server);
  held.tier.hold_at(0, SlowShrinkTier::Hold::kMoving);
  Connection other = raw_connection(held.server->port());
  send_request(other, request_header(Op::kShrink, 1, 1), {});
  ASSERT_TRUE(eventually([&] { return held.tier.holding(); }, 60.0));
  Connection conn = raw_connection(held.server->port());
  std::vector<uint8_t> save;
  encode_save_request(SaveKind::kBase, "m", &save);
  send_request(conn, request_header(Op::kSave, 2, 1), save);
  // Queued: it reports the running shrink's progress.
  Frame progress;
  ASSERT_TRUE(conn.recv_frame(&progress, kDefaultMaxPayloadBytes, seconds_from_now(60)).ok());
  ASSERT_TRUE(is_progress(progress.header));
  Connection again = raw_connection(held.server->port());
  send_request(again, request_header(Op::kShrink, 2, 2), {});
  const Frame busy = reply_of(again);
  const Status st = decode_error_reply(busy.header, busy.payload.data(), busy.payload.size());
  EXPECT_EQ(st.code(), Status::Code::kAborted) << st.to_string();
  EXPECT_NE(st.message().find("server busy"), std::string::npos) << st.message();
  EXPECT_EQ(held.server->counters().bulk_busy, 1u);
  held.tier.release();
  EXPECT_EQ(reply_of(other).header.status, Status::Code::kOk);
  EXPECT_EQ(reply_of(conn).header.status, Status::Code::kOk);
  EXPECT_EQ(held.server->counters().bulk_runs, 2u);  // the other client's SHRINK and this SAVE
  EXPECT_EQ(held.table->day(), 1);                   // one shrink ran
}

}  // namespace
}  // namespace gpubox::table::server
