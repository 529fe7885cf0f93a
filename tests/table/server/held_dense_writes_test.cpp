// Ranged DENSE writes held by the server (ps_store.hpp) against clients that hold writes open and
// never finish them, or take a new client id (or loopback address) on every connection: such a
// client is still one host (share_address), held to its share of the server's slots; at that
// share, a client holding the most gives its idlest write to a trainer holding fewer, so a hostile
// or broken client of a host cannot keep that host's trainers out; the writes it abandons (its
// connections closed) give way too, but not before a trainer whose connection closed under it could
// reconnect and finish; a writer whose connection went half-open (the peer vanished without closing
// it, which the server sees only by TCP keepalive, set on every connection it accepts) gets its
// slot back when it writes the table again.
#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>

#include "table/server/ps_protocol.hpp"
#include "table/server/remote_host_tier.hpp"
#include "table/server/server.hpp"
#include "tests/table/server/fake_host_tier.hpp"
#include "tests/table/server/server_test_util.hpp"

namespace gpubox::table::server {
namespace {

using namespace testing;  // NOLINT: FakeHostTier and the loopback helpers

// The first range of write `write` of table `table` (8 values) from `client`.
Status start_write(Connection& conn, uint64_t client, uint64_t write, uint64_t request_id,
                   const char* table = "dense") {
  DenseRequest head = dense_range(DenseAction::kWrite, 8, 0, 4, write);
  head.name = table;
  return raw_dense(conn, head, &kFour, request_id, nullptr, client);
}

// A range of a held write the server dropped: refused (NotFound) naming the write and why.
void expect_dropped(const Status& st, uint64_t write, const std::string& why) {
  EXPECT_EQ(st.code(), Status::Code::kNotFound) << st.to_string();
  EXPECT_NE(st.message().find("write " + std::to_string(write) + " was dropped: " + why),
            std::string::npos)
      << why << ": " << st.to_string();
  EXPECT_NE(st.message().find("write the table again"), std::string::npos) << st.to_string();
}

const std::vector<float> kOne = {9.0f};

// A client holding one write on an open connection, and a client taking a new id for each write
// on connections it closes, fill the address's share: before the grace of a quarter of
// dense_write_max_idle_s, the first client's second write is refused (no client holds more than
// it, and no abandoned write is past the grace); after it, the abandoned write idle longest gives
// way (before, such writes filled all 64 slots for dense_write_max_idle_s).
TEST(HeldDenseWrites, AbandonedWritesOfARotatingClientGiveWayAfterTheGrace) {
  FakeHostTier table(test_config());
  ServerOptions so;
  // Taken after a grace of 10 s, dropped by the sweep after 40 s: the setup and the refusal fit
  // well within the grace even on a loaded machine (else the test is skipped, not failed).
  so.dense_write_max_idle_s = 40.0;
  auto server = start_server(&table, so);
  ASSERT_TRUE(server);
  Connection trainer = connect_as(*server, false, 7);
  const auto began = Clock::now();  // no held write received a range before
  ASSERT_TRUE(start_write(trainer, 7, 1, 2).ok());
  for (uint64_t c = 1000; c < 1000 + kMaxHeldDenseWritesPerHost - 1; ++c) {
    Connection rotating = connect_as(*server, false, c);
    const Status st = start_write(rotating, c, 1, 10);
    ASSERT_TRUE(st.ok()) << "client " << c << ": " << st.to_string();
  }
  ASSERT_TRUE(eventually([&] { return server->counters().open_connections == 1; }));
  EXPECT_EQ(server->counters().dense_held_writes, kMaxHeldDenseWritesPerHost);
  // Writes of another table: a rewrite of "dense" would release the trainer's own first write,
  // idle past the grace too.
  const Status refused = start_write(trainer, 7, 2, 3, "other");
  const auto last_setup = Clock::now();  // every rotating write's last range came before
  if (last_setup - began > std::chrono::seconds(9)) {
    GTEST_SKIP() << "the setup took past the grace of 10 s (a loaded machine)";
  }
  EXPECT_EQ(refused.code(), Status::Code::kResourceExhausted) << refused.to_string();
  for (const char* words :
       {"write 2 of client 7 from 127.0.0.1: peer 127.0.0.1 (host loopback) already holds 32",
        "no other client holds more of them than this one's 1", "nor is one abandoned for 10 s"}) {
    EXPECT_NE(refused.message().find(words), std::string::npos)
        << words << ": " << refused.to_string();
  }
  std::this_thread::sleep_until(last_setup + std::chrono::milliseconds(10200));
  const Status taken = start_write(trainer, 7, 3, 4, "other");
  ASSERT_TRUE(taken.ok()) << taken.to_string();
  std::vector<uint8_t> reply;
  ASSERT_TRUE(write_half(trainer, 7, 1, 4, kOtherFour, 5, &reply).ok());
  EXPECT_TRUE(dense_committed(reply, 4));  // the trainer's first write was never the one dropped
  EXPECT_EQ(server->counters().dense_held_writes, kMaxHeldDenseWritesPerHost - 1);
  // The rotating client's first write, idlest of the abandoned ones, was: its later range is
  // told so, and holds no new write (which could never commit, and would take another's slot).
  Connection rotating = connect_as(*server, false, 1000);
  expect_dropped(write_half(rotating, 1000, 1, 4, kOtherFour, 11), 1,
                 "its slot went to a write of another client (its connections closed)");
  EXPECT_EQ(server->counters().dense_held_writes, kMaxHeldDenseWritesPerHost - 1);
}

// A trainer whose connection closed under it (a transport retry) reconnects at once and finishes
// its write: a client of its address at the address's limit meanwhile takes the slot of a client
// holding more writes, not the trainer's (a write whose connections closed is taken for abandoned
// only once it received no range for a quarter of dense_write_max_idle_s).
TEST(HeldDenseWrites, AWriterThatReconnectsAtOnceKeepsItsWriteAtTheLimit) {
  FakeHostTier table(test_config());
  ServerOptions so;
  so.dense_write_max_idle_s = 20.0;  // a grace of 5 s: far more than this test takes
  auto server = start_server(&table, so);
  ASSERT_TRUE(server);
  {
    Connection lost = connect_as(*server, false, 7);
    ASSERT_TRUE(start_write(lost, 7, 1, 2).ok());
  }
  ASSERT_TRUE(eventually([&] { return server->counters().open_connections == 0; }));
  std::vector<Connection> open;  // other clients of 127.0.0.1 fill its share, on open connections
  hold_writes(*server, false, "127.0.0.1", 1000, kMaxStagedDenseWrites - 1,
              kMaxHeldDenseWritesPerHost, &open);
  ASSERT_EQ(server->counters().dense_held_writes, kMaxHeldDenseWritesPerHost);
  Connection late = connect_as(*server, false, 2000);
  const Status taken = start_write(late, 2000, 1, 2);
  ASSERT_TRUE(taken.ok()) << taken.to_string();
  Connection again = connect_as(*server, false, 7);
  std::vector<uint8_t> reply;
  ASSERT_TRUE(write_half(again, 7, 1, 4, kOtherFour, 3, &reply).ok());
  EXPECT_TRUE(dense_committed(reply, 4));
  EXPECT_EQ(server->counters().dense_held_writes, kMaxHeldDenseWritesPerHost - 1);
}

// A hostile (or broken) process of 127.0.0.1 holds its address's whole share on open connections,
// never finishing a write: as a few clients holding 4 each, or as one client id per write. A
// trainer of the same address still writes at once (in raw ranges, and through RemoteHostTier in
// ranges under a small frame limit), each new write taking the idlest write of a client holding
// the most; the dropped hostile write's last range commits nothing; the address never holds more
// than its share, nor does the process spreading its new ids over 127.0.0.2, 127.0.0.3, ...: every
// loopback address is one host (share_address), whose trainer at 127.0.0.2 writes at once too.
// (Trainers of other hosts beside it: server_hosts_test.cpp, in a network namespace.)
class HostileHolder : public ::testing::TestWithParam<std::size_t> {};  // writes per hostile id

TEST_P(HostileHolder, ATrainerOfTheSameAddressWritesAtOnce) {
  const std::size_t per_client = GetParam();
  FakeHostTier table(test_config());
  ServerOptions so;
  so.max_payload_bytes = 4096;  // RemoteHostTier writes its table of 2048 values in ranges
  auto server = start_server(&table, so);
  ASSERT_TRUE(server);
  std::vector<Connection> hostile;
  hold_writes(*server, false, "127.0.0.1", 1000, per_client, kMaxHeldDenseWritesPerHost, &hostile);
  ASSERT_EQ(server->counters().dense_held_writes, kMaxHeldDenseWritesPerHost);
  ASSERT_EQ(hostile.size(), kMaxHeldDenseWritesPerHost / per_client);
  const auto started = Clock::now();
  for (uint64_t trainer = 7; trainer < 10; ++trainer) {
    write_commits(*server, false, "127.0.0.1", trainer);
    EXPECT_EQ(server->counters().dense_held_writes, kMaxHeldDenseWritesPerHost - 1);
    // The hostile process takes the freed slot again, with a new id.
    hostile.push_back(connect_as(*server, false, 3000 + trainer));
    ASSERT_TRUE(start_write(hostile.back(), 3000 + trainer, 1, 2).ok());
    EXPECT_EQ(server->counters().dense_held_writes, kMaxHeldDenseWritesPerHost);
  }
  auto options = client_options(server->endpoint());
  options.client_id = 77;
  options.max_payload_bytes = 4096;
  auto client = connect_client(options);
  ASSERT_TRUE(client);
  std::vector<float> values(2048);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = 0.25f * static_cast<float>(i);
  std::vector<float> written = values;
  const Status dense = client->dense(DenseAction::kWrite, "trainer", &written);
  ASSERT_TRUE(dense.ok()) << dense.to_string();
  std::vector<float> read(values.size(), -1.0f);
  ASSERT_TRUE(client->dense(DenseAction::kRead, "trainer", &read).ok());
  EXPECT_EQ(read, values);
  // At once: not after the grace of a quarter of dense_write_max_idle_s (30 s) that abandoned
  // writes get (loose: a loaded machine may take seconds).
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - started).count(), 25.0);
  // The first hostile client's first write was the idlest of those holding the most: dropped,
  // and its later range, refused, takes no slot from anyone.
  expect_dropped(write_half(hostile.front(), 1000, 1, 4, kOtherFour, 20), 1,
                 "its slot went to a write of another client (the slowest of a client holding");
  EXPECT_EQ(server->counters().dense_held_writes, kMaxHeldDenseWritesPerHost - 1);
  write_commits(*server, false, "127.0.0.2", 80);
  EXPECT_EQ(server->counters().dense_held_writes, kMaxHeldDenseWritesPerHost - 1);
  for (uint64_t spread = 3; spread < 3 + kMaxHeldDenseWritesPerHost; ++spread) {
    const std::string source = "127.0.0." + std::to_string(spread);
    hostile.push_back(connect_as(*server, false, 4000 + spread, source.c_str()));
    const Status st = start_write(hostile.back(), 4000 + spread, 1, 2);
    ASSERT_TRUE(st.ok()) << source << ": " << st.to_string();
    EXPECT_EQ(server->counters().dense_held_writes, kMaxHeldDenseWritesPerHost) << source;
  }
}

INSTANTIATE_TEST_SUITE_P(WritesPerId, HostileHolder,
                         ::testing::Values(std::size_t{1}, kMaxStagedDenseWrites));

// A client that announces a large ranged write and drips it, a value now and then, cannot hold
// the dense memory: past the grace of a quarter of dense_write_max_idle_s, a write whose bytes
// came slower than --min_transfer_kb_s is stalled and gives its announced bytes to a trainer's
// write at the limit (logged). Before, the trainer was refused until the dripping write went
// without a range for the whole dense_write_max_idle_s, which a drip never does.
TEST(HeldDenseWrites, ADrippedWriteGivesItsAnnouncedBytesToATrainerAtTheMemoryLimit) {
  FakeHostTier table(test_config());
  ServerOptions so;
  so.max_dense_bytes = 1 << 20;
  // A grace of 4 s: the trainer's write below must be refused within it (on a loaded machine
  // too), and the drips keep coming within it.
  so.dense_write_max_idle_s = 16.0;
  auto server = start_server(&table, so);
  ASSERT_TRUE(server);
  const std::vector<float> one{1.0f};
  const auto range = [](const char* name, uint32_t total, uint32_t offset, uint32_t count,
                        uint64_t write) {
    DenseRequest head = dense_range(DenseAction::kWrite, total, offset, count, write);
    head.name = name;
    return head;
  };
  // 480 KB announced, and as much again for its commit copy: 960 KB of the 1 MiB.
  Connection dripping = connect_as(*server, false, 5);
  ASSERT_TRUE(raw_dense(dripping, range("hog", 120000, 0, 1, 1), &one, 2, nullptr, 5).ok());
  const auto hog_began = Clock::now();  // after the server took its first range
  // A trainer's write of 40000 values (160 KB) does not fit beside it within the grace.
  Connection trainer = connect_as(*server, false, 7);
  const std::vector<float> half(20000, 0.5f);
  const Status refused = raw_dense(trainer, range("t", 40000, 0, 20000, 1), &half, 2, nullptr, 7);
  EXPECT_EQ(refused.code(), Status::Code::kResourceExhausted) << refused.to_string();
  EXPECT_NE(refused.message().find("no held write is stalled"), std::string::npos)
      << refused.to_string();
  // The dripping write never idles: a value every 0.4 s, until past the grace (counted from
  // after its first range was taken, so the server's count is at least as long).
  uint32_t drop = 0;
  while (Clock::now() - hog_began < std::chrono::milliseconds(4400)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(400));
    ++drop;
    ASSERT_TRUE(
        raw_dense(dripping, range("hog", 120000, drop, 1, 1), &one, 2 + drop, nullptr, 5).ok());
  }
  // A write announcing more than the limit even without the stalled one is refused, and drops
  // nothing for nothing (before, it emptied every stalled write first).
  Connection forger = connect_as(*server, false, 9);
  const Status forged = raw_dense(forger, range("f", UINT32_MAX, 0, 1, 1), &one, 2, nullptr, 9);
  EXPECT_EQ(forged.code(), Status::Code::kResourceExhausted) << forged.to_string();
  EXPECT_EQ(server->counters().dense_held_writes, 1u);
  // A whole write (one frame) gets the stalled write's room as a ranged write's first range does.
  const std::vector<float> table_of_w(40000, 0.25f);  // 160 KB: over the limit beside the drip
  ASSERT_TRUE(raw_dense(trainer, range("w", 40000, 0, 40000, 0), &table_of_w, 3, nullptr, 7).ok());
  EXPECT_EQ(server->counters().dense_held_writes, 0u);  // the dripping write was dropped
  const Status late =
      raw_dense(dripping, range("hog", 120000, drop + 1, 1, 1), &one, 3 + drop, nullptr, 5);
  EXPECT_EQ(late.code(), Status::Code::kNotFound) << late.to_string();
  EXPECT_NE(late.message().find("was dropped: stalled"), std::string::npos) << late.to_string();
  ASSERT_TRUE(raw_dense(trainer, range("t", 40000, 0, 20000, 2), &half, 4, nullptr, 7).ok());
  std::vector<uint8_t> reply;
  ASSERT_TRUE(raw_dense(trainer, range("t", 40000, 20000, 20000, 2), &half, 5, &reply, 7).ok());
  EXPECT_TRUE(dense_committed(reply, 20000));
}

// A writer whose connection went half-open (here: left open and silent) starts its write of the
// table again on a new connection: its stale write (no range for a quarter of
// dense_write_max_idle_s) is released at once, not held until the idle sweep; a write that is
// still moving (another thread of the client writing the table) is not.
TEST(HeldDenseWrites, ARewriteSupersedesTheSameClientsStaleWriteOnAHalfOpenConnection) {
  FakeHostTier table(test_config());
  ServerOptions so;
  // Stale after 4 s (dropped by the sweep after 16 s): the two writes below must start within
  // that of each other, on a loaded machine too.
  so.dense_write_max_idle_s = 16.0;
  auto server = start_server(&table, so);
  ASSERT_TRUE(server);
  Connection half_open = connect_as(*server, false, 5);
  ASSERT_TRUE(start_write(half_open, 5, 1, 2).ok());
  Connection again = connect_as(*server, false, 5);
  ASSERT_TRUE(start_write(again, 5, 2, 2).ok());
  EXPECT_EQ(server->counters().dense_held_writes, 2u);  // write 1 is moving: kept
  std::this_thread::sleep_for(std::chrono::milliseconds(4200));
  std::vector<uint8_t> reply;
  ASSERT_TRUE(write_half(again, 5, 2, 4, kOtherFour, 3, &reply).ok());
  EXPECT_TRUE(dense_committed(reply, 4));
  EXPECT_EQ(server->counters().dense_held_writes, 1u);  // write 1, stale
  const Status st = start_write(again, 5, 3, 4);
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(server->counters().dense_held_writes, 1u);  // write 3 alone: write 1 superseded
  // The stale write's range arriving late is told it was dropped, and holds nothing.
  expect_dropped(write_half(half_open, 5, 1, 4, kOtherFour, 3), 1, "superseded by a newer write");
  EXPECT_EQ(server->counters().dense_held_writes, 1u);
}

// A hostile process of the trainer's address, a new client id for each write, drips a value into
// each of its writes every 100 ms (so each is touched more recently than the trainer's, which
// moves 80 KB ranges every 300 ms) and keeps taking the address's slots with new ids: the slot it
// takes is always one of its own slowest writes, never the trainer's moving write, which commits.
// Before, the victim was the write idle longest: the trainer's, at the first new id.
TEST(HeldDenseWrites, ADrippingClientCannotTakeATrainersMovingWrite) {
  FakeHostTier table(test_config());
  ServerOptions so;
  so.dense_write_max_idle_s = 8.0;            // a grace of 2 s
  so.min_transfer_bytes_per_s = 64 * 1024.0;  // the trainer moves about 260 KB/s
  auto server = start_server(&table, so);
  ASSERT_TRUE(server);
  constexpr uint32_t kRange = 20000;  // values
  constexpr uint32_t kRanges = 12;
  const std::vector<float> range(kRange, 0.5f);
  Connection trainer = connect_as(*server, false, 7);
  const auto send = [&](uint32_t r, std::vector<uint8_t>* reply) {
    DenseRequest head = dense_range(DenseAction::kWrite, kRange * kRanges, r * kRange, kRange, 1);
    head.name = "trainer";
    return raw_dense(trainer, head, &range, 100 + r, reply, 7);
  };
  ASSERT_TRUE(send(0, nullptr).ok());
  // Hostile client 1000 + h's write: 100000 values announced, one value a range.
  std::vector<Connection> hostile;
  uint64_t id = 1000;
  const auto drip = [&](std::size_t h, uint32_t offset) {
    DenseRequest head = dense_range(DenseAction::kWrite, 100000, offset, 1, 1);
    return raw_dense(hostile[h], head, &kOne, ++id, nullptr, 1000 + h);
  };
  const auto take_a_slot = [&] {
    hostile.push_back(connect_as(*server, false, 1000 + hostile.size()));
    return drip(hostile.size() - 1, 0);
  };
  while (hostile.size() + 1 < kMaxHeldDenseWritesPerHost) ASSERT_TRUE(take_a_slot().ok());
  ASSERT_EQ(server->counters().dense_held_writes, kMaxHeldDenseWritesPerHost);
  std::vector<uint8_t> reply;
  uint32_t dripped = 0;
  for (uint32_t r = 1; r < kRanges; ++r) {
    for (int i = 0; i < 3; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      ++dripped;  // refused once dropped: no matter
      for (std::size_t h = 0; h < hostile.size(); ++h) (void)drip(h, dripped);
    }
    const Status took = take_a_slot();
    EXPECT_TRUE(took.ok()) << took.to_string();
    const Status st = send(r, &reply);
    ASSERT_TRUE(st.ok()) << "range " << r << ": " << st.to_string();
  }
  EXPECT_TRUE(dense_committed(reply, (kRanges - 1) * kRange));
}

// A trainer's ranged write dropped mid-transfer (here: its own client id begins
// kMaxStagedDenseWrites more writes, so its oldest, the trainer's, gives way) is written again
// whole, once, under a new write id: the table holds what was written. Before, its later ranges
// held a new write that could never commit, and the write failed at its last range.
TEST(HeldDenseWrites, ATrainersDroppedWriteIsWrittenAgainOnce) {
  FakeHostTier table(test_config());
  ServerOptions so;
  so.max_payload_bytes = 4096;
  auto server = start_server(&table, so);
  ASSERT_TRUE(server);
  auto options = client_options(server->endpoint());
  options.client_id = 77;
  options.max_payload_bytes = 4096;
  options.deadline_s = 30.0;
  auto client = connect_client(options);
  ASSERT_TRUE(client);
  std::vector<float> values(1 << 21);  // 8 MB in about 2000 ranges
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i % 1000);
  std::atomic<bool> done{false};
  Status written;
  std::thread writer([&] {
    std::vector<float> copy = values;
    written = client->dense(DenseAction::kWrite, "trainer", &copy);
    done = true;
  });
  ASSERT_TRUE(eventually([&] { return server->counters().dense_held_writes > 0 || done; }));
  Connection same_id = connect_as(*server, false, 77);
  for (uint64_t w = 1; w <= kMaxStagedDenseWrites; ++w) {
    EXPECT_TRUE(write_half(same_id, 77, 1u << 30 | w, 0, kFour, 10 + w).ok());
  }
  const bool raced = !done;
  writer.join();
  if (!raced) GTEST_SKIP() << "the write finished before its client's other writes began";
  ASSERT_TRUE(written.ok()) << written.to_string();
  std::vector<float> read(values.size(), -1.0f);
  ASSERT_TRUE(client->dense(DenseAction::kRead, "trainer", &read).ok());
  EXPECT_EQ(read, values);
}

}  // namespace
}  // namespace gpubox::table::server
