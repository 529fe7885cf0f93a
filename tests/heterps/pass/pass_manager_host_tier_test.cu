// Evaluation passes and host tiers: an evaluation pass reads without creating and gives its rows
// back; a host tier that counts what crosses it (replicated: each row once) or fails its pushes
// (the write-back retried without loss); a gpubox_server on loopback restarted from its
// checkpoint between passes, against the in-process reference.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/error.hpp"
#include "heterps/device/counters.hpp"
#include "heterps/pass/pass_manager.hpp"
#include "table/server/remote_host_tier.hpp"
#include "table/server/server.hpp"
#include "table/sparse_row/accessor.hpp"
#include "table/sparse_table.hpp"
#include "tests/common/free_port.hpp"
#include "tests/heterps/device/test_cards.hpp"
#include "tests/heterps/pass/pass_manager_test_util.cuh"
#include "tests/table/forwarding_host_tier.hpp"

namespace gpubox::pass {
namespace {

using pass_test::Engine;
using pass_test::make_passes;
using pass_test::rows_equal;
using pass_test::test_config;
using table::AccessorConfig;

// An in-process host tier of test_config(), for the tests that wrap or serve it.
std::unique_ptr<table::SparseTable> open_table() {
  auto opened = table::SparseTable::open(test_config(), table::HostTableConfig{});
  return std::move(opened.value());
}

// An evaluation pass (PassAccess::kEvaluate) over keys about half of which the model never saw:
// during it the cards hold every key, the known ones as the host tier has them and the new ones
// as init_row with their slot; the host tier is never changed (nothing created, nothing written
// back), and end_pass leaves the cards as they were: with no budget the same keys and rows, with
// a budget that made it evict, a subset of them (clean rows, still in the host tier).
TEST(PassManager, EvaluationPassReadsWithoutCreatingAndGivesTheRowsBack) {
  GPUBOX_REQUIRE_CARDS(2);
  for (const std::size_t budget : {std::size_t{0}, std::size_t{130}}) {
    SCOPED_TRACE("row budget " + std::to_string(budget));
    PassManagerOptions options;
    options.card_row_budget = budget;
    Engine engine(2, options);
    const auto passes = make_passes(2, 200, 21);  // pass 1 shares about half of pass 0's keys
    engine.manager->begin_pass(passes[0]);
    engine.train(passes[0], 3, 3);
    engine.manager->end_pass();
    const auto host_before = engine.host_rows();
    const auto cards_before = engine.card_rows();
    const std::vector<int32_t> slots(passes[1].size(), 4);
    const PassStats begin =
        engine.manager->begin_pass(passes[1], slots, nullptr, PassAccess::kEvaluate);
    EXPECT_EQ(begin.created, 0u);
    if (budget > 0) {
      EXPECT_GT(begin.evicted, 0u) << "the budget case must evict";
    }
    const auto during = engine.card_rows();
    const table::RowLayout& layout = engine.host->layout();
    std::size_t unknown = 0;
    for (const uint64_t key : passes[1]) {
      const auto it = during.find(key);
      ASSERT_NE(it, during.end()) << "key " << key << " not placed";
      const auto held = host_before.find(key);
      std::vector<float> want(layout.stride());
      if (held != host_before.end()) {
        want = held->second;
      } else {
        table::init_row(want.data(), layout, test_config(), key, 4);
        ++unknown;
      }
      EXPECT_TRUE(rows_equal(it->second, want)) << "key " << key;
    }
    EXPECT_GT(unknown, 50u);
    const PassStats end = engine.manager->end_pass();
    EXPECT_EQ(end.written_back, 0u);
    EXPECT_EQ(engine.host_rows(), host_before);
    const auto after = engine.card_rows();
    if (budget == 0) {
      EXPECT_EQ(after, cards_before);
    } else {
      EXPECT_LT(after.size(), cards_before.size());
      for (const auto& [key, row] : after) {
        const auto it = cards_before.find(key);
        ASSERT_NE(it, cards_before.end()) << "key " << key << " stayed on the cards";
        EXPECT_TRUE(rows_equal(row, it->second)) << "key " << key;
      }
    }
    // A training pass afterwards creates the new keys as usual.
    EXPECT_EQ(engine.manager->begin_pass(passes[1], slots).created, unknown);
    engine.manager->end_pass();
  }
}

// A host tier that fails pushes after a number of rows: end_pass fails with a clear error, the
// rows stay dirty on the cards, and a retried end_pass completes the write-back.
class FlakyHost : public table::testing::ForwardingHostTier {
 public:
  using ForwardingHostTier::ForwardingHostTier;
  Status pull(const uint64_t* k, const int32_t* s, std::size_t n, float* r,
              std::size_t* c) override {
    pulled_keys += n;
    return ForwardingHostTier::pull(k, s, n, r, c);
  }
  Status push(const uint64_t* k, std::size_t n, const float* r) override {
    if (fail_pushes) return Status::Unavailable("server 127.0.0.1:1 gone (injected)");
    const int push = pushes++;
    if (push == fail_push)
      return Status::Unavailable("push " + std::to_string(push) + " (injected)");
    if (push == throw_push)
      throw std::runtime_error("push " + std::to_string(push) + " (injected)");
    // The rows must stay as they were while the push reads them: a write-back that refilled a
    // batch buffer before its push was done (a missing retire) shows here as a changed checksum.
    const std::size_t floats = n * layout().stride();
    const uint64_t before = checksum(r, floats);
    const Status st = ForwardingHostTier::push(k, n, r);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    if (checksum(r, floats) != before) return Status::Internal("rows changed during their push");
    pushed_keys += n;
    return st;
  }
  bool fail_pushes = false;
  // The push of this number (counted from 0 over the tier's life) fails with a Status, or throws.
  int fail_push = -1;
  int throw_push = -1;
  std::atomic<int> pushes{0};
  std::atomic<uint64_t> pulled_keys{0};  // keys asked of the inner tier by pull
  std::atomic<uint64_t> pushed_keys{0};

 private:
  static uint64_t checksum(const float* r, std::size_t floats) {
    uint64_t sum = 1469598103934665603ull;
    for (std::size_t i = 0; i < floats; ++i) {
      uint32_t bits;
      std::memcpy(&bits, r + i, sizeof(bits));
      sum = (sum ^ bits) * 1099511628211ull;
    }
    return sum;
  }
};

// Replicated placement over 3 cards: each row crosses the host-tier boundary once per pass, not
// once per card (card 0 pulls or stages it and the others insert its copy; card 0 writes back).
TEST(PassManager, ReplicatedPassesReadAndWriteEachRowOnce) {
  GPUBOX_REQUIRE_CARDS(3);
  std::unique_ptr<table::SparseTable> inner = open_table();
  FlakyHost counting(*inner);
  PassManagerOptions options;
  options.placement = heter_comm::Placement::kReplicated;
  Engine engine(3, options, &counting);
  engine.inspect = inner.get();
  const auto passes = make_passes(2, 150, 21);
  const PassStats first = engine.manager->begin_pass(passes[0]);
  EXPECT_EQ(counting.pulled_keys.load(), passes[0].size());
  EXPECT_EQ(first.created, passes[0].size());
  engine.train(passes[0], 1, 3);
  const PassStats first_end = engine.manager->end_pass();
  EXPECT_EQ(counting.pushed_keys.load(), first_end.written_back);
  // The second pass staged ahead: only its new keys are read, once.
  const std::vector<uint64_t> exclude;
  const StagedRows staged = engine.manager->stage_rows(passes[1], {}, exclude);
  EXPECT_EQ(staged.keys.size(), passes[1].size());
  engine.manager->begin_pass(passes[1], {}, &staged);
  std::set<uint64_t> both(passes[0].begin(), passes[0].end());
  both.insert(passes[1].begin(), passes[1].end());
  EXPECT_EQ(counting.pulled_keys.load(), passes[0].size() + passes[1].size());
  engine.train(passes[1], 2, 3);
  engine.manager->end_pass();
  EXPECT_EQ(engine.card_rows().size(), both.size());  // identical replicas of the whole table
  EXPECT_EQ(engine.host_rows().size(), both.size());
}

TEST(PassManager, FailedWriteBackIsRetriedWithoutLoss) {
  GPUBOX_REQUIRE_CARDS(2);
  std::unique_ptr<table::SparseTable> inner = open_table();
  FlakyHost flaky(*inner);
  Engine engine(2, PassManagerOptions{}, &flaky);
  Engine reference(2, PassManagerOptions{});
  const auto keys = make_passes(1, 200, 5)[0];
  engine.manager->begin_pass(keys);
  reference.manager->begin_pass(keys);
  engine.train(keys, 9, 3);
  reference.train(keys, 9, 3);
  flaky.fail_pushes = true;
  try {
    engine.manager->end_pass();
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("injected"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(engine.manager->in_pass());
  flaky.fail_pushes = false;
  const PassStats end = engine.manager->end_pass();
  EXPECT_GT(end.written_back, 0u);
  reference.manager->end_pass();
  std::map<uint64_t, std::vector<float>> got;
  throw_if_error(inner->for_each_row([&](uint64_t key, const float* row) {
    got[key] = std::vector<float>(row, row + inner->layout().stride());
  }));
  auto want = reference.host_rows();
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [k, row] : want) ASSERT_TRUE(rows_equal(got.at(k), row)) << k;
}

// The write-back in batches of 16 with 2 pushes in flight: a push failing with a Status mid-window,
// then (at the retry) one throwing, leave the queued pushes to drain and every row dirty; the
// next retry writes them all, and the host tier equals the reference's bit for bit. The host tier
// checksums each push's rows before and after it reads them (a buffer refilled early fails it).
TEST(PassManager, FailedBatchedWriteBackIsRetriedWithoutLoss) {
  std::unique_ptr<table::SparseTable> inner = open_table();
  FlakyHost flaky(*inner);
  PassManagerOptions options;
  options.host_batch_keys = 16;
  options.pulls_in_flight = 2;
  Engine engine(1, options, &flaky);
  Engine reference(1, options);
  const auto keys = make_passes(1, 200, 7)[0];
  engine.manager->begin_pass(keys);
  reference.manager->begin_pass(keys);
  engine.train(keys, 11, 10);
  reference.train(keys, 11, 10);
  const PassStats want_end = reference.manager->end_pass();
  ASSERT_GT((want_end.written_back + 15) / 16, 5u) << "too few batches";
  flaky.fail_push = 2;
  try {
    engine.manager->end_pass();
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("push 2 (injected)"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(engine.manager->in_pass());
  flaky.throw_push = flaky.pushes.load() + 1;  // the retry's second push
  try {
    engine.manager->end_pass();
    FAIL() << "no error";
  } catch (const std::exception& e) {
    // The throw's own message (its push's number), not the Status path's "push 2".
    const std::string thrown = "push " + std::to_string(flaky.throw_push) + " (injected)";
    EXPECT_NE(std::string(e.what()).find(thrown), std::string::npos) << e.what();
  }
  EXPECT_TRUE(engine.manager->in_pass());
  const PassStats end = engine.manager->end_pass();
  EXPECT_EQ(end.written_back, want_end.written_back);  // every row was still dirty
  std::map<uint64_t, std::vector<float>> got;
  throw_if_error(inner->for_each_row([&](uint64_t key, const float* row) {
    got[key] = std::vector<float>(row, row + inner->layout().stride());
  }));
  const auto want = reference.host_rows();
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [k, row] : want) ASSERT_TRUE(rows_equal(got.at(k), row)) << k;
}

// Issue 31: a pass's end copies its rows off the card into pinned batch buffers and waits for the
// card once per batch (not once per page), with no pageable copy (the keys are read back into
// pinned memory too); the buffers are kept, so a second pass's end allocates no pinned memory.
// Batches of 16 rows with 2 pushes in flight: the 3 batch buffers are reused several times a
// pass, and the host tier then holds every card row bit for bit (a buffer refilled before its
// push read it would show here).
TEST(PassManager, WriteBackCopiesThroughReusedPinnedBatches) {
  PassManagerOptions options;
  options.host_batch_keys = 16;
  options.pulls_in_flight = 2;
  Engine engine(1, options);
  const auto passes = make_passes(2, 200, 13);
  for (std::size_t pass = 0; pass < passes.size(); ++pass) {
    engine.manager->begin_pass(passes[pass]);
    engine.train(passes[pass], 31 + pass, 3);
    const device::DeviceCounts before = engine.card_set.card(0).counts();
    const PassStats end = engine.manager->end_pass();
    const device::DeviceCounts spent = engine.card_set.card(0).counts() - before;
    const uint64_t batches = (end.written_back + 15) / 16;
    ASSERT_GT(batches, 3u) << "pass " << pass << ": too few rows to reuse the buffers";
    EXPECT_EQ(spent.pageable_copies, 0u) << "pass " << pass;
    // The listing's two counts (the table's entries, then its dirty ones), the keys' readback,
    // one per batch, the dirty flags' clearing.
    EXPECT_EQ(spent.host_syncs, batches + 4) << "pass " << pass;
    // The keys and 3 batch buffers at the first pass's end, none at the second's.
    EXPECT_EQ(spent.pinned_allocations, pass == 0 ? 4u : 0u) << "pass " << pass;
    EXPECT_EQ(spent.pinned_frees, 0u) << "pass " << pass;
    const auto host = engine.host_rows();
    for (const auto& [key, row] : engine.card_rows()) {
      ASSERT_TRUE(rows_equal(host.at(key), row)) << "pass " << pass << ", key " << key;
    }
  }
}

// A small write-back (a sync() before a save, a short first pass) makes its batch buffer of a
// whole batch: a later larger one reuses it instead of freeing it and making it again
// (cudaFreeHost waits for the whole device).
TEST(PassManager, SmallWriteBackMakesWholeBatchBuffers) {
  PassManagerOptions options;
  options.host_batch_keys = 16;
  options.pulls_in_flight = 2;
  Engine engine(1, options);
  const std::vector<uint64_t> keys = make_passes(1, 200, 17)[0];
  engine.manager->begin_pass(keys);
  engine.train({keys[0], keys[1], keys[2]}, 5, 1);
  const device::DeviceCounts before_sync = engine.card_set.card(0).counts();
  const uint64_t synced = engine.manager->sync();
  ASSERT_GT(synced, 0u);
  ASSERT_LE(synced, 3u);
  // The keys' buffer and one batch buffer.
  EXPECT_EQ((engine.card_set.card(0).counts() - before_sync).pinned_allocations, 2u);
  engine.train(keys, 6, 3);
  const device::DeviceCounts before = engine.card_set.card(0).counts();
  const PassStats end = engine.manager->end_pass();
  const device::DeviceCounts spent = engine.card_set.card(0).counts() - before;
  ASSERT_GT((end.written_back + 15) / 16, 3u);
  // The keys' buffer grows (freed, made again); the batch buffer is kept, two more are made.
  EXPECT_EQ(spent.pinned_frees, 1u);
  EXPECT_EQ(spent.pinned_allocations, 3u);
  const auto host = engine.host_rows();
  for (const auto& [key, row] : engine.card_rows()) {
    ASSERT_TRUE(rows_equal(host.at(key), row)) << "key " << key;
  }
}

// The production end_pass keeps the next pass's keys dirty on the cards (trainer_steps.cpp): its
// copies go through pinned buffers kept from pass to pass too (the row indices read back, the
// keep keys uploaded and their rows read back a page at a time, the pushed rows' indices put
// back), so the second pass's end makes no pageable copy and allocates no pinned memory. Both
// passes train the same 200 keys and keep every other one, so both ends list as many rows; the
// rows not kept reach the host tier bit for bit, the kept ones stay dirty until sync().
TEST(PassManager, WriteBackKeepingKeysCopiesThroughReusedPinnedBuffers) {
  PassManagerOptions options;
  options.host_batch_keys = 16;
  options.pulls_in_flight = 2;
  card_table::HashTableOptions table_options;
  table_options.page_rows = 64;  // the 100 keep keys looked up in two pages: 64, then 36
  Engine engine(1, options, nullptr, table_options);
  const std::vector<uint64_t> keys = make_passes(1, 200, 13)[0];
  const std::set<uint64_t> sorted(keys.begin(), keys.end());
  std::vector<uint64_t> keep;  // every other key, sorted
  bool take = true;
  for (const uint64_t key : sorted) {
    if (take) keep.push_back(key);
    take = !take;
  }
  for (int pass = 0; pass < 2; ++pass) {
    engine.manager->begin_pass(keys);
    engine.train(keys, 41 + pass, 40);  // 2000 draws: every key dirty, so both ends list 200
    const device::DeviceCounts before = engine.card_set.card(0).counts();
    const PassStats end = engine.manager->end_pass(keep);
    const device::DeviceCounts spent = engine.card_set.card(0).counts() - before;
    EXPECT_EQ(end.kept_dirty, keep.size()) << "pass " << pass;
    EXPECT_EQ(end.written_back, sorted.size() - keep.size()) << "pass " << pass;
    ASSERT_GT((end.written_back + 15) / 16, 3u) << "pass " << pass << ": too few rows";
    EXPECT_EQ(spent.pageable_copies, 0u) << "pass " << pass;
    // The keys, the row indices, a page of keep keys and of found rows, 3 batch buffers.
    EXPECT_EQ(spent.pinned_allocations, pass == 0 ? 7u : 0u) << "pass " << pass;
    EXPECT_EQ(spent.pinned_frees, 0u) << "pass " << pass;
    const auto host = engine.host_rows();
    for (const auto& [key, row] : engine.card_rows()) {
      // The kept rows stay dirty: their host rows still hold the value before the pass.
      const bool kept = std::binary_search(keep.begin(), keep.end(), key);
      ASSERT_EQ(rows_equal(host.at(key), row), !kept) << "pass " << pass << ", key " << key;
    }
  }
  EXPECT_EQ(engine.manager->sync(), keep.size());
  const auto host = engine.host_rows();
  for (const auto& [key, row] : engine.card_rows()) {
    ASSERT_TRUE(rows_equal(host.at(key), row)) << "key " << key;
  }
}

// The same passes with the host tier behind a gpubox_server on loopback, restarted between
// passes from the checkpoint it saved: nothing is lost, and the host rows still equal the
// uncached in-process reference bit for bit.
TEST(PassManager, ServerHostTierWithRestartFromCheckpointMatchesReference) {
  GPUBOX_REQUIRE_CARDS(2);
  namespace srv = table::server;
  const std::string save_dir =
      ::testing::TempDir() + "gpubox_pass_server_" + std::to_string(::getpid());
  std::unique_ptr<table::SparseTable> backing = open_table();
  srv::ServerOptions server_options;
  server_options.data_dir = ::testing::TempDir();  // SAVE paths must lie inside it
  server_options.port = gpubox::testing::port_below_ephemeral_range();  // restarted on it
  auto started = srv::Server::start(backing.get(), server_options);
  ASSERT_TRUE(started.ok()) << started.status().to_string();
  std::unique_ptr<srv::Server> server = std::move(started.value());

  srv::RemoteHostTierOptions client_options;
  client_options.endpoints = server->endpoint();
  client_options.config = test_config();
  client_options.deadline_s = 10.0;
  auto connected = srv::RemoteHostTier::connect(client_options);
  ASSERT_TRUE(connected.ok()) << connected.status().to_string();
  std::unique_ptr<srv::RemoteHostTier> remote = std::move(connected.value());

  PassManagerOptions options;
  options.host_batch_keys = 53;
  Engine cached(2, options, remote.get());
  cached.inspect = backing.get();
  Engine reference(2, PassManagerOptions{});

  const auto passes = make_passes(4, 200, 31);
  for (std::size_t p = 0; p < passes.size(); ++p) {
    cached.manager->begin_pass(passes[p]);
    reference.manager->begin_pass(passes[p]);
    cached.train(passes[p], 500 + p, 3);
    reference.train(passes[p], 500 + p, 3);
    cached.manager->end_pass();
    reference.manager->end_pass();
    reference.forget_cards();

    auto got = cached.host_rows();
    auto want = reference.host_rows();
    ASSERT_EQ(got.size(), want.size()) << "pass " << p;
    for (const auto& [k, row] : want)
      ASSERT_TRUE(rows_equal(got.at(k), row)) << "key " << k << " pass " << p;

    if (p == 1) {
      // Checkpoint on the server, stop it, lose its memory, restart it from the checkpoint on
      // the same port. The trainer's client reconnects on its own.
      throw_if_error(remote->save(save_dir, table::SaveKind::kCheckpoint));
      server->stop();
      server->wait();
      server.reset();
      backing = open_table();
      throw_if_error(backing->load(save_dir));
      server_options.loaded_model = save_dir;  // as --load: the client sees its save came back
      auto restarted = srv::Server::start(backing.get(), server_options);
      ASSERT_TRUE(restarted.ok()) << restarted.status().to_string();
      server = std::move(restarted.value());
      cached.inspect = backing.get();
    }
  }
  std::filesystem::remove_all(save_dir);
}

}  // namespace
}  // namespace gpubox::pass
