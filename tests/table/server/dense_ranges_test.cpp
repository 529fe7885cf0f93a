// DENSE of a table over the frame limit (protocol 6, ps_protocol.hpp): the client carries it in
// ranges, and reads, adds and writes give what one frame gives (a server with the default limit)
// and what a plain vector computes, at the sizes around the range sizes; concurrent adds in
// ranges lose nothing; a retried add is applied once while a read skips the retry cache; a call
// made again under its request id (DenseCall::request_id) is applied once; and the server refuses
// hostile ranges (outside the table, overlapping, truncated, a reply over its frame limit, a huge
// announced table) with an error naming the client, allocating nothing for them, and goes on
// serving.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>

#include "table/server/ps_protocol.hpp"
#include "table/server/remote_host_tier.hpp"
#include "table/server/server.hpp"
#include "tests/table/server/fake_host_tier.hpp"
#include "tests/table/server/server_test_util.hpp"

namespace gpubox::table::server {
namespace {

using namespace testing;  // NOLINT: FakeHostTier and the loopback helpers

constexpr uint32_t kSmallFrame = 4096;
// The values per range that RemoteHostTier::dense fits in kSmallFrame for table "dense": an add
// carries its values both ways (8 bytes a value), a ranged read or a write one way (4 bytes).
constexpr std::size_t kHead = 64 + 5 + kDenseReplyHeadBytes;
constexpr std::size_t kAddRange = (kSmallFrame - kHead) / 8;
constexpr std::size_t kOneWayRange = (kSmallFrame - kHead) / 4;

std::vector<float> random_values(std::size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

struct Pair {
  FakeHostTier small_table{test_config()}, oracle_table{test_config()};
  std::unique_ptr<Server> small, oracle;  // frame limit kSmallFrame, and the default
  std::unique_ptr<RemoteHostTier> ranged, whole;
  Pair() {
    ServerOptions so;
    so.max_payload_bytes = kSmallFrame;
    small = start_server(&small_table, so);
    oracle = start_server(&oracle_table);
    if (small && oracle) {
      auto options = client_options(small->endpoint());
      options.connections_per_endpoint = 1;  // no new connection (and its INFO) mid-way
      ranged = connect_client(options);
      whole = connect_client(client_options(oracle->endpoint()));
    }
  }
};

TEST(DenseRanges, ReadsAddsAndWritesOfAnySizeMatchOneFrameAndTheOracle) {
  Pair p;
  ASSERT_TRUE(p.ranged && p.whole);
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, kAddRange - 1, kAddRange, kAddRange + 1,
                        kOneWayRange, kOneWayRange + 1, 2 * kOneWayRange, 7 * kOneWayRange + 3}) {
    SCOPED_TRACE("n = " + std::to_string(n));
    const std::vector<float> start = random_values(n, static_cast<uint32_t>(n) + 1);
    const std::vector<float> delta = random_values(n, static_cast<uint32_t>(n) + 2);
    std::vector<float> oracle = start;
    for (std::size_t i = 0; i < n; ++i) oracle[i] += delta[i];
    const uint64_t before = p.small->counters().requests;
    for (RemoteHostTier* client : {p.ranged.get(), p.whole.get()}) {
      std::vector<float> written = start;
      ASSERT_TRUE(client->dense(DenseAction::kWrite, "dense", &written).ok());
      EXPECT_EQ(written, start);
      std::vector<float> read(n, 0.0f);
      ASSERT_TRUE(client->dense(DenseAction::kRead, "dense", &read).ok());
      EXPECT_EQ(read, start);
      std::vector<float> sum = delta;
      const Status added = client->dense(DenseAction::kAdd, "dense", &sum);
      ASSERT_TRUE(added.ok()) << added.to_string();
      EXPECT_EQ(sum, oracle);
      std::fill(read.begin(), read.end(), 0.0f);
      ASSERT_TRUE(client->dense(DenseAction::kRead, "dense", &read).ok());
      EXPECT_EQ(read, oracle);
    }
    // The small server took ranges: a request per range of each of the four calls.
    // (A write in one frame up to kOneWayRange values; a read or an add up to kAddRange; a
    // ranged read carries no values, kOneWayRange a range.)
    const auto ranges = [&](std::size_t per) {
      return std::max<std::size_t>(1, (n + per - 1) / per);
    };
    const std::size_t reads = n <= kAddRange ? 1 : ranges(kOneWayRange);
    EXPECT_EQ(p.small->counters().requests - before,
              ranges(kOneWayRange) + 2 * reads + ranges(kAddRange));
  }
}

// Four clients add to a table of several ranges at once: every add is there in the end.
TEST(DenseRanges, ConcurrentAddsInRangesLoseNothing) {
  Pair p;
  ASSERT_TRUE(p.ranged);
  const std::size_t n = 3 * kAddRange + 11;
  std::vector<float> zeros(n, 0.0f);
  ASSERT_TRUE(p.ranged->dense(DenseAction::kWrite, "dense", &zeros).ok());
  constexpr int kClients = 4, kAdds = 8;
  std::vector<std::thread> threads;
  std::vector<Status> results(kClients);
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&, c] {
      auto client = RemoteHostTier::connect(client_options(p.small->endpoint()));
      if (!client.ok()) return void(results[c] = client.status());
      for (int a = 0; a < kAdds && results[c].ok(); ++a) {
        std::vector<float> ones(n, 1.0f);
        results[c] = (*client)->dense(DenseAction::kAdd, "dense", &ones);
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const Status& st : results) ASSERT_TRUE(st.ok()) << st.to_string();
  std::vector<float> read(n, 0.0f);
  ASSERT_TRUE(p.ranged->dense(DenseAction::kRead, "dense", &read).ok());
  EXPECT_EQ(read, std::vector<float>(n, static_cast<float>(kClients * kAdds)));
}

void expect_refused(const Status& st, Status::Code code, const std::string& words) {
  EXPECT_EQ(st.code(), code) << st.to_string();
  EXPECT_NE(st.message().find(words), std::string::npos) << st.to_string();
}

TEST(DenseRanges, HostileRangesAreRefusedNamingTheClientAndTheServerGoesOn) {
  FakeHostTier table(test_config());
  ServerOptions so;
  so.max_payload_bytes = kSmallFrame;
  auto server = start_server(&table, so);
  ASSERT_TRUE(server);
  Connection conn = raw_connection(server->port());
  uint64_t id = 1;
  const std::vector<float> four = {1.0f, 2.0f, 3.0f, 4.0f};
  // A staged write of 8 values: [0,4), then [2,6) overlaps it, then [4,8) completes it.
  std::vector<uint8_t> reply;
  ASSERT_TRUE(
      raw_dense(conn, dense_range(DenseAction::kWrite, 8, 0, 4, 9), &four, id++, &reply).ok());
  auto head = decode_dense_reply(reply.data(), reply.size(), 0, 0);
  ASSERT_TRUE(head.ok());
  EXPECT_FALSE(head->committed);
  expect_refused(raw_dense(conn, dense_range(DenseAction::kWrite, 8, 2, 4, 9), &four, id++),
                 Status::Code::kInvalidArgument, "of client 1 overlaps the range [0, 4)");
  // The same write naming another size of table.
  expect_refused(raw_dense(conn, dense_range(DenseAction::kWrite, 9, 4, 4, 9), &four, id++),
                 Status::Code::kInvalidArgument, "its first range named 'dense' of 8");
  ASSERT_TRUE(
      raw_dense(conn, dense_range(DenseAction::kWrite, 8, 4, 4, 9), &four, id++, &reply).ok());
  head = decode_dense_reply(reply.data(), reply.size(), 4, 0);
  ASSERT_TRUE(head.ok());
  EXPECT_TRUE(head->committed);
  // A range outside the table, from the decoder: named with the client.
  expect_refused(raw_dense(conn, dense_range(DenseAction::kAdd, 8, 6, 4), &four, id++),
                 Status::Code::kInvalidArgument, "range [6, 10) is outside a table of 8 values");
  expect_refused(raw_dense(conn, dense_range(DenseAction::kAdd, 8, 6, 4), &four, id++),
                 Status::Code::kInvalidArgument, "of client 1");
  // A total other than the table's, an add without values, a truncated range.
  expect_refused(raw_dense(conn, dense_range(DenseAction::kAdd, 12, 0, 4), &four, id++),
                 Status::Code::kInvalidArgument, "holds 8 values; the request has 12");
  expect_refused(raw_dense(conn, dense_range(DenseAction::kAdd, 8, 0, 4), nullptr, id++),
                 Status::Code::kInvalidArgument, "carries its values");
  std::vector<uint8_t> payload;
  DenseRequest add = dense_range(DenseAction::kAdd, 8, 0, 4);
  add.has_values = true;
  encode_dense_range(add, four.data(), &payload);
  payload.resize(payload.size() - 3);
  expect_refused(raw_call(conn, Op::kDense, payload, id++), Status::Code::kCorruption,
                 "DENSE request");
  // Hostile lengths: a read whose reply would be 16 GiB, a write announcing 2^32 - 1 values
  // (staged: only its 4 values are held), a read of a 2^32 - 1 table that is not there.
  expect_refused(
      raw_dense(conn, dense_range(DenseAction::kRead, UINT32_MAX, 0, UINT32_MAX), nullptr, id++),
      Status::Code::kResourceExhausted, "over the frame limit of 4096 bytes");
  expect_refused(
      raw_dense(conn, dense_range(DenseAction::kWrite, UINT32_MAX, 0, 4, 10), &four, id++),
      Status::Code::kResourceExhausted, "(gpubox_server --max_dense_mb)");
  expect_refused(raw_dense(conn, dense_range(DenseAction::kRead, UINT32_MAX, 0, 4), nullptr, id++),
                 Status::Code::kInvalidArgument, "holds 8 values; the request has 4294967295");
  // Served as before: the table is the staged write's 8 values.
  ASSERT_TRUE(
      raw_dense(conn, dense_range(DenseAction::kRead, 8, 0, 8), nullptr, id++, &reply).ok());
  head = decode_dense_reply(reply.data(), reply.size(), 0, 8);
  ASSERT_TRUE(head.ok());
  std::vector<float> read(8);
  std::memcpy(read.data(), head->values, sizeof(float) * 8);
  EXPECT_EQ(read, (std::vector<float>{1, 2, 3, 4, 1, 2, 3, 4}));
  EXPECT_EQ(server->counters().protocol_errors, 0u);
}

// Beyond kMaxStagedDenseWrites ranged writes of one client at once, its oldest is dropped: its last
// range is then refused naming why (the client writes the table again; the table keeps its values)
// and holds nothing, so it takes no other write's place.
TEST(DenseRanges, TheOldestOfTooManyStagedWritesIsDroppedNotCommittedInPart) {
  FakeHostTier table(test_config());
  auto server = start_server(&table);
  ASSERT_TRUE(server);
  Connection conn = raw_connection(server->port());
  uint64_t id = 1;
  const std::vector<float> four = {1.0f, 2.0f, 3.0f, 4.0f};
  for (uint64_t w = 1; w <= kMaxStagedDenseWrites + 1; ++w) {
    ASSERT_TRUE(raw_dense(conn, dense_range(DenseAction::kWrite, 8, 0, 4, w), &four, id++).ok());
  }
  const Status late = raw_dense(conn, dense_range(DenseAction::kWrite, 8, 4, 4, 1), &four, id++);
  EXPECT_EQ(late.code(), Status::Code::kNotFound) << late.to_string();
  EXPECT_NE(late.message().find("write 1 was dropped: its client began more than " +
                                std::to_string(kMaxStagedDenseWrites) + " ranged writes at once"),
            std::string::npos)
      << late.to_string();
  EXPECT_EQ(server->counters().dense_held_writes, kMaxStagedDenseWrites);
  // Write 2, now the oldest held, was not displaced by write 1's late range: it commits.
  std::vector<uint8_t> reply;
  ASSERT_TRUE(
      raw_dense(conn, dense_range(DenseAction::kWrite, 8, 4, 4, 2), &four, id++, &reply).ok());
  auto head = decode_dense_reply(reply.data(), reply.size(), 4, 0);
  ASSERT_TRUE(head.ok());
  EXPECT_TRUE(head->committed);
}

// A retried add (same request id) is applied once; a read is not remembered: read again under the
// same id, it gives the table as it is now (so the ranges of a big table never fill the retry
// cache).
TEST(DenseRanges, ARetriedAddIsAppliedOnceAReadIsReadAgain) {
  FakeHostTier table(test_config());
  auto server = start_server(&table);
  ASSERT_TRUE(server);
  Connection conn = raw_connection(server->port());
  const std::vector<float> four = {1.0f, 2.0f, 3.0f, 4.0f};
  ASSERT_TRUE(raw_dense(conn, dense_range(DenseAction::kWrite, 4, 0, 4), &four, 1).ok());
  const auto read = [&](uint64_t id) {
    std::vector<uint8_t> reply;
    EXPECT_TRUE(
        raw_dense(conn, dense_range(DenseAction::kRead, 4, 0, 4), nullptr, id, &reply).ok());
    auto head = decode_dense_reply(reply.data(), reply.size(), 0, 4);
    std::vector<float> values(4);
    if (head.ok()) std::memcpy(values.data(), head->values, sizeof(float) * 4);
    return values;
  };
  EXPECT_EQ(read(2), four);
  ASSERT_TRUE(raw_dense(conn, dense_range(DenseAction::kAdd, 4, 0, 4), &four, 3).ok());
  ASSERT_TRUE(raw_dense(conn, dense_range(DenseAction::kAdd, 4, 0, 4), &four, 3).ok());  // a retry
  EXPECT_EQ(read(2), (std::vector<float>{2, 4, 6, 8}));
  EXPECT_EQ(server->counters().duplicate_requests, 1u);
}

// DenseCall::request_id: a call made again under its request id (a call its client gave up on,
// trainer_zero_work.hpp's TrainerZeroPublishes) is applied once, a new request again; a table sent
// in ranges cannot be sent so (many requests).
TEST(DenseRanges, ACallMadeAgainUnderItsRequestIdIsAppliedOnce) {
  FakeHostTier table(test_config());
  auto server = start_server(&table);
  ASSERT_TRUE(server);
  auto client = connect_client(client_options(server->endpoint()));
  ASSERT_TRUE(client);
  std::vector<float> values{1.0f, 2.0f};
  ASSERT_TRUE(client->dense(DenseAction::kRead, "dense", &values).ok());  // created
  DenseCall again;
  again.request_id = client->next_request_id();
  for (int i = 0; i < 2; ++i) {
    std::vector<float> delta{10.0f, 10.0f};
    ASSERT_TRUE(client->dense(DenseAction::kAdd, "dense", &delta, again).ok());
  }
  std::vector<float> read(2, 0.0f);
  ASSERT_TRUE(client->dense(DenseAction::kRead, "dense", &read).ok());
  EXPECT_EQ(read, (std::vector<float>{11.0f, 12.0f}));
  std::vector<float> delta{10.0f, 10.0f};
  ASSERT_TRUE(client->dense(DenseAction::kAdd, "dense", &delta).ok());
  ASSERT_TRUE(client->dense(DenseAction::kRead, "dense", &read).ok());
  EXPECT_EQ(read, (std::vector<float>{21.0f, 22.0f}));

  Pair pair;
  ASSERT_TRUE(pair.ranged);
  std::vector<float> big(3 * kOneWayRange, 1.0f);
  DenseCall ranged;
  ranged.request_id = pair.ranged->next_request_id();
  EXPECT_EQ(pair.ranged->dense(DenseAction::kWrite, "dense", &big, ranged).code(),
            Status::Code::kInvalidArgument);
}

// An add range's reply is up to a frame; two of them took a retry cache of 64 MiB whole,
// forgetting the replies that keep other retries from applying twice. Now an add is remembered
// without its values, and a retry reads its range again: with the cache below two add replies, a
// retried add (after another add) is still applied once, and answered with the table's values.
TEST(DenseRanges, RetriedAddsAreAppliedOnceWhenTwoAddRepliesWouldFillTheRetryCache) {
  FakeHostTier table(test_config());
  constexpr uint32_t kValues = 1024;
  ServerOptions so;
  so.dedup_max_bytes = 6000;  // one add reply (4 KiB of values) fits, two do not
  auto server = start_server(&table, so);
  ASSERT_TRUE(server);
  Connection conn = raw_connection(server->port());
  const std::vector<float> start = random_values(kValues, 7), delta = random_values(kValues, 8);
  ASSERT_TRUE(
      raw_dense(conn, dense_range(DenseAction::kWrite, kValues, 0, kValues), &start, 1).ok());
  ASSERT_TRUE(raw_dense(conn, dense_range(DenseAction::kAdd, kValues, 0, kValues), &delta, 2).ok());
  ASSERT_TRUE(raw_dense(conn, dense_range(DenseAction::kAdd, kValues, 0, kValues), &delta, 3).ok());
  std::vector<uint8_t> reply;
  ASSERT_TRUE(
      raw_dense(conn, dense_range(DenseAction::kAdd, kValues, 0, kValues), &delta, 2, &reply).ok());
  EXPECT_EQ(server->counters().duplicate_requests, 1u);
  std::vector<float> twice = start;
  for (uint32_t i = 0; i < kValues; ++i) twice[i] = (start[i] + delta[i]) + delta[i];
  auto head = decode_dense_reply(reply.data(), reply.size(), 0, kValues);
  ASSERT_TRUE(head.ok()) << head.status().to_string();
  std::vector<float> answered(kValues);
  std::memcpy(answered.data(), head->values, sizeof(float) * kValues);
  EXPECT_EQ(answered, twice);  // the range read again, not added again
  // The first write's entry is still remembered too.
  ASSERT_TRUE(
      raw_dense(conn, dense_range(DenseAction::kWrite, kValues, 0, kValues), &start, 1).ok());
  EXPECT_EQ(server->counters().duplicate_requests, 2u);
  std::vector<float> read(kValues, 0.0f);
  auto client = connect_client(client_options(server->endpoint()));
  ASSERT_TRUE(client);
  ASSERT_TRUE(client->dense(DenseAction::kRead, "dense", &read).ok());
  EXPECT_EQ(read, twice);
}

// --max_dense_mb counts the tables, every held write at its announced size (before anything is
// allocated for it) and the copy that commits the largest held write.
TEST(DenseRanges, TheDenseMemoryLimitCountsTablesHeldWritesAndTheCommitCopy) {
  FakeHostTier table(test_config());
  ServerOptions so;
  so.max_dense_bytes = 1024;  // 256 values
  auto server = start_server(&table, so);
  ASSERT_TRUE(server);
  Connection conn = raw_connection(server->port());
  uint64_t id = 1;
  const std::vector<float> fifty = random_values(50, 1), three_hundred = random_values(300, 2);
  // A whole write of 300 values, and a ranged write announcing 1000, from client 5.
  expect_refused(raw_dense(conn, dense_range(DenseAction::kWrite, 300, 0, 300), &three_hundred,
                           id++, nullptr, 5),
                 Status::Code::kResourceExhausted, "a write of client 5 would take");
  expect_refused(
      raw_dense(conn, dense_range(DenseAction::kWrite, 1000, 0, 50, 1), &fifty, id++, nullptr, 5),
      Status::Code::kResourceExhausted, "over its limit of 1024 bytes");
  // 100 values in two ranges: 400 held + 400 of commit copy fit; it commits.
  // (Every frame of the connection carries client 5: it is bound to the first frame's id.)
  std::vector<uint8_t> reply;
  ASSERT_TRUE(
      raw_dense(conn, dense_range(DenseAction::kWrite, 100, 0, 50, 2), &fifty, id++, nullptr, 5)
          .ok());
  ASSERT_TRUE(
      raw_dense(conn, dense_range(DenseAction::kWrite, 100, 50, 50, 2), &fifty, id++, &reply, 5)
          .ok());
  EXPECT_TRUE(dense_committed(reply, 50));
  // Another table of 100 in ranges: 400 of table + 400 held + 400 of copy do not.
  DenseRequest other = dense_range(DenseAction::kWrite, 100, 0, 50, 3);
  other.name = "other";
  expect_refused(raw_dense(conn, other, &fifty, id++, nullptr, 5), Status::Code::kResourceExhausted,
                 "tables 400, ranged writes held 400, the largest one's commit copy 400");
  // Rewriting the table itself (whole) replaces its bytes: 400 fit.
  std::vector<float> hundred = random_values(100, 3);
  ASSERT_TRUE(
      raw_dense(conn, dense_range(DenseAction::kWrite, 100, 0, 100), &hundred, id++, nullptr, 5)
          .ok());
}

// A big table's DENSE call is given its bytes' time at 1 MiB/s beyond the call deadline (the
// server's own transfer floor): a 64 MB table is written and added to by a client whose call
// deadline (0.25 s) alone could not carry it (issue 32: fat_deepffm's 71 MB table, on a loaded
// machine, once took over runner.server_timeout_s for one range and failed the job).
TEST(DenseRanges, ABigTablesCallHasTimeForItsBytes) {
  FakeHostTier table(test_config());
  auto server = start_server(&table);
  ASSERT_TRUE(server);
  RemoteHostTierOptions o = client_options(server->endpoint());
  o.deadline_s = 0.25;
  auto client = connect_client(o);
  ASSERT_TRUE(client);
  std::vector<float> values(16u << 20, 1.0f);
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(client->dense(DenseAction::kWrite, "big", &values).ok());
  Status added = client->dense(DenseAction::kAdd, "big", &values);
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("64 MB written and added in %.2f s (call deadline %.2f s)\n", took, o.deadline_s);
  ASSERT_TRUE(added.ok()) << added.to_string();
  EXPECT_EQ(values.front(), 2.0f);
  EXPECT_EQ(values.back(), 2.0f);
}

// A ranged write's range of no values is refused before anything is held for it (a 50-byte frame
// once held a write, and dropped another's).
TEST(DenseRanges, ARangedWritesRangeOfNoValuesIsRefusedAndHoldsNothing) {
  FakeHostTier table(test_config());
  auto server = start_server(&table);
  ASSERT_TRUE(server);
  Connection conn = raw_connection(server->port());
  const std::vector<float> none;
  expect_refused(raw_dense(conn, dense_range(DenseAction::kWrite, 8, 0, 0, 1), &none, 1),
                 Status::Code::kInvalidArgument, "carries no values");
  // The write of 0 values (whole) is still a write.
  ASSERT_TRUE(raw_dense(conn, dense_range(DenseAction::kWrite, 0, 0, 0, 2), &none, 2).ok());
}

// One client's ranged writes, however many, never drop another client's: beyond
// kMaxStagedDenseWrites it drops its own oldest.
TEST(DenseRanges, OneClientsWritesNeverDropAnotherClients) {
  FakeHostTier table(test_config());
  auto server = start_server(&table);
  ASSERT_TRUE(server);
  Connection conn = raw_connection(server->port());
  Connection other = raw_connection(server->port());  // client 2's (a connection is one client)
  uint64_t id = 1;
  const std::vector<float> four = {1.0f, 2.0f, 3.0f, 4.0f};
  ASSERT_TRUE(raw_dense(conn, dense_range(DenseAction::kWrite, 8, 0, 4, 1), &four, id++).ok());
  for (uint64_t w = 1; w <= 2 * kMaxStagedDenseWrites; ++w) {
    ASSERT_TRUE(
        raw_dense(other, dense_range(DenseAction::kWrite, 8, 0, 4, w), &four, id++, nullptr, 2)
            .ok());
  }
  EXPECT_EQ(server->counters().dense_held_writes, 1 + kMaxStagedDenseWrites);
  std::vector<uint8_t> reply;
  ASSERT_TRUE(
      raw_dense(conn, dense_range(DenseAction::kWrite, 8, 4, 4, 1), &four, id++, &reply).ok());
  EXPECT_TRUE(dense_committed(reply, 4));  // client 1's write was held throughout
}

// A held write whose writer died (no range for dense_write_max_idle_s) is dropped by the sweep.
TEST(DenseRanges, AnIdleHeldWriteIsDropped) {
  FakeHostTier table(test_config());
  ServerOptions so;
  so.dense_write_max_idle_s = 0.2;
  auto server = start_server(&table, so);
  ASSERT_TRUE(server);
  Connection conn = raw_connection(server->port());
  const std::vector<float> four = {1.0f, 2.0f, 3.0f, 4.0f};
  std::vector<uint8_t> reply;
  // Ranges within the idle limit of each other commit.
  ASSERT_TRUE(raw_dense(conn, dense_range(DenseAction::kWrite, 8, 0, 4, 1), &four, 1).ok());
  ASSERT_TRUE(raw_dense(conn, dense_range(DenseAction::kWrite, 8, 4, 4, 1), &four, 2, &reply).ok());
  EXPECT_TRUE(dense_committed(reply, 4));
  ASSERT_TRUE(raw_dense(conn, dense_range(DenseAction::kWrite, 8, 0, 4, 2), &four, 3).ok());
  ASSERT_TRUE(eventually([&] { return server->counters().dense_held_writes == 0; }))
      << "the idle write was never dropped";
  // Its first range was dropped: this one is told so (and starts nothing that could not commit).
  const Status late = raw_dense(conn, dense_range(DenseAction::kWrite, 8, 4, 4, 2), &four, 4);
  EXPECT_EQ(late.code(), Status::Code::kNotFound) << late.to_string();
  EXPECT_NE(late.message().find("write 2 was dropped: no range of it arrived for gpubox_server "
                                "--dense_write_max_idle_s"),
            std::string::npos)
      << late.to_string();
  EXPECT_EQ(server->counters().dense_held_writes, 0u);
}

}  // namespace
}  // namespace gpubox::table::server
