// The pass boundary's write-back (pass_write_back.cpp): the host tier after end_pass against an
// unordered_map oracle, bit for bit, at 0, 1, n and n + 1 dirty rows around the staging halves,
// pages and batches; and what it asks of the card: its card buffers (the listing, a page of keep
// keys and rows) and pinned buffers are made by the first end_pass that needs them and reused
// after (0 card allocations a pass boundary then), grown only by a pass that needs more; each
// batch is gathered and copied half a page at a time on two streams ordered by events, with one
// host wait a batch, or on cpu pushed where its rows lie on the card (by their addresses), with
// one host wait a batch and no stream wait; the two ways leave the same host tier, bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "heterps/device/counters.hpp"
#include "heterps/pass/pass_manager.hpp"
#include "tests/heterps/pass/pass_manager_test_util.cuh"
#include "tests/table/forwarding_host_tier.hpp"
#include "tests/table/slot_dims_config.hpp"

namespace gpubox::pass {
namespace {

using pass_test::Engine;
using pass_test::make_passes;
using pass_test::row_diff;
using pass_test::rows_equal;
using Oracle = std::unordered_map<uint64_t, std::vector<float>>;

constexpr std::size_t kPageRows = 8;  // staging halves of 4 rows
constexpr std::size_t kHalf = kPageRows / 2;
constexpr std::size_t kBatch = 6;  // a batch ends inside a half

PassManagerOptions small_batches() {
  PassManagerOptions options;
  options.host_batch_keys = kBatch;
  options.pulls_in_flight = 2;
  return options;
}

card_table::HashTableOptions small_pages(std::size_t page_rows = kPageRows) {
  card_table::HashTableOptions table_options;
  table_options.page_rows = page_rows;
  return table_options;
}

// What the host tier must hold after an end_pass keeping `keep` (sorted): every host row as it
// was, but the card's row for each card key not kept (the clean ones are equal already).
Oracle expected_after_end(Engine& engine, const std::vector<uint64_t>& keep) {
  Oracle oracle;
  for (const auto& [key, row] : engine.host_rows()) oracle[key] = row;
  for (const auto& [key, row] : engine.card_rows()) {
    if (!std::binary_search(keep.begin(), keep.end(), key)) oracle[key] = row;
  }
  return oracle;
}

void expect_host_holds(Engine& engine, const Oracle& oracle) {
  const auto host = engine.host_rows();
  ASSERT_EQ(host.size(), oracle.size());
  for (const auto& [key, row] : host) {
    const auto want = oracle.find(key);
    ASSERT_NE(want, oracle.end()) << "key " << key << " is not in the oracle";
    ASSERT_TRUE(rows_equal(row, want->second))
        << "key " << key << ": " << row_diff(row, want->second);
  }
}

// Whether the write-back stages its rows on the card and copies them off on the copy stream (a
// copy a part): cuda always, the cpu backend under GPUBOX_DEVICE_CHECK=defer (the _defer tests),
// where the deferred streams then check the events between the halves.
bool stages_rows([[maybe_unused]] Engine& engine) {
#if defined(GPUBOX_BACKEND_CUDA)
  return true;
#else
  return engine.card_set.card(0).stream().deferred() != nullptr;
#endif
}

// Whether `engine`'s write-back pushes the rows where they lie on the card (its options'
// write_back_in_place, on the cpu backend but under GPUBOX_DEVICE_CHECK=defer, to a host tier
// that takes rows by address: HostTier::pushes_by_address): no gather, no part, no stream wait.
bool reads_rows_in_place(Engine& engine) {
  return engine.options.write_back_in_place && !stages_rows(engine) &&
         engine.host->pushes_by_address();
}

// The card's stream waits of a write-back of `rows` rows: 2 a gathered part (the gather waits for
// its half's copy, the copy for the gather), none in place.
uint64_t stream_waits_of(Engine& engine, uint64_t rows, uint64_t half = kHalf);

// Parts of `half` rows (half a page; a page of one row is one part) a write-back of `rows` rows
// gathers: each batch's own.
uint64_t parts_of(uint64_t rows, uint64_t half = kHalf) {
  uint64_t parts = 0;
  for (uint64_t b = 0; b < rows; b += kBatch) {
    const uint64_t n = std::min<uint64_t>(kBatch, rows - b);
    parts += (n + half - 1) / half;
  }
  return parts;
}

uint64_t stream_waits_of(Engine& engine, uint64_t rows, uint64_t half) {
  return reads_rows_in_place(engine) ? 0 : 2 * parts_of(rows, half);
}

// Passes over the same 64 keys, each training exactly `dirty` of them (every one of 20 steps of
// 50 draws: each drawn at least once), so the write-back pushes 0, 1, a half page (n) and n + 1,
// a batch and one more, a page and one more, and many batches; every third pass and the last keep
// half of the dirty keys for the next pass (or the sync after the last). After each end_pass the
// host tier equals the oracle bit for bit, and the card orders each part with 2 stream waits.
// Pages of kPageRows (two staging halves) and of one row (one half, its parts in turn: the
// staging stays within the page).
class PassWriteBackPages : public ::testing::TestWithParam<std::size_t> {};

TEST_P(PassWriteBackPages, HostTierMatchesTheOracleAtEverySize) {
  const std::size_t page_rows = GetParam();
  const uint64_t half = std::max<std::size_t>(1, page_rows / 2);
  Engine engine(1, small_batches(), nullptr, small_pages(page_rows));
  const std::vector<uint64_t> keys = make_passes(1, 64, 29)[0];
  std::set<uint64_t> kept_before;  // the pass before kept them dirty
  const std::vector<std::size_t> sizes = {
      0, 1, kHalf, kHalf + 1, kBatch, kBatch + 1, kPageRows, kPageRows + 1, 2 * kBatch + 1, 61};
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    const std::size_t dirty = sizes[i];
    SCOPED_TRACE("pass " + std::to_string(i) + ": " + std::to_string(dirty) + " dirty rows");
    engine.manager->begin_pass(keys);
    const std::vector<uint64_t> trained(keys.begin(), keys.begin() + dirty);
    engine.train(trained, 100 + i, dirty == 0 ? 0 : 20);
    std::vector<uint64_t> keep;
    if (i % 3 == 2 || i + 1 == sizes.size()) {
      for (std::size_t k = 0; k < dirty; k += 2) keep.push_back(trained[k]);
      std::sort(keep.begin(), keep.end());
    }
    const Oracle oracle = expected_after_end(engine, keep);
    const device::DeviceCounts before = engine.card_set.card(0).counts();
    const PassStats end = engine.manager->end_pass(keep);
    const device::DeviceCounts spent = engine.card_set.card(0).counts() - before;
    // The rows kept by the pass before are dirty too: written now unless kept again.
    std::set<uint64_t> dirty_keys(trained.begin(), trained.end());
    dirty_keys.insert(kept_before.begin(), kept_before.end());
    const uint64_t written = dirty_keys.size() - keep.size();
    ASSERT_EQ(end.kept_dirty, keep.size());
    ASSERT_EQ(end.written_back, written);
    kept_before = std::set<uint64_t>(keep.begin(), keep.end());
    ASSERT_NO_FATAL_FAILURE(expect_host_holds(engine, oracle));
    EXPECT_EQ(spent.stream_waits, stream_waits_of(engine, written, half));
    EXPECT_EQ(spent.copy_stream_copies, stages_rows(engine) ? parts_of(written, half) : 0u);
    EXPECT_EQ(spent.pageable_copies, 0u);
  }
  // What the last pass kept is written by a sync.
  const Oracle oracle = expected_after_end(engine, {});
  EXPECT_EQ(engine.manager->sync(), kept_before.size());
  ASSERT_NO_FATAL_FAILURE(expect_host_holds(engine, oracle));
}
INSTANTIATE_TEST_SUITE_P(PassWriteBack, PassWriteBackPages, ::testing::Values(kPageRows, 1),
                         [](const auto& info) { return "Page" + std::to_string(info.param); });

// Card and pinned allocations of end_pass, pass by pass, each training every key of its pass: the
// first end_pass makes the pinned buffers (its listing and card pages were made by begin_pass's
// look-up, which borrows them: on both backends), later ones allocate nothing; the first with kept
// keys makes the pinned keep page, later ones nothing; a pass with more rows on the card
// than any before grows the listing (and the pinned keys) once, freeing the smaller ones, and the
// pass after it allocates nothing again.
TEST(PassWriteBack, EndPassAllocatesOnlyWhenItNeedsMoreThanBefore) {
  Engine engine(1, small_batches(), nullptr, small_pages());
  const std::vector<uint64_t> keys = make_passes(1, 200, 31)[0];
  const std::vector<uint64_t> more = make_passes(1, 500, 37)[0];
  std::vector<uint64_t> keep;  // every other key of the first 200, sorted
  for (std::size_t k = 0; k < keys.size(); k += 2) keep.push_back(keys[k]);
  std::sort(keep.begin(), keep.end());
  struct Pass {
    const std::vector<uint64_t>* keys;
    bool keep;
    uint64_t allocations, frees, pinned_allocations, pinned_frees;
  };
  const Pass passes[] = {
      {&keys, false, 0, 0, 4, 0},  // the keys' pinned buffer, 3 batch buffers
      {&keys, false, 0, 0, 0, 0},
      {&keys, true, 0, 0, 3, 0},  // pinned keep, found, row indices (the card's page is kept)
      {&keys, true, 0, 0, 0, 0},
      {&more, false, 2, 2, 1, 1},  // the listing (keys, rows) and the pinned keys grow
      {&more, false, 0, 0, 0, 0},
  };
  for (std::size_t p = 0; p < std::size(passes); ++p) {
    SCOPED_TRACE("pass " + std::to_string(p));
    const std::vector<uint64_t>& pass_keys = *passes[p].keys;
    engine.manager->begin_pass(pass_keys);
    engine.train(pass_keys, 50 + p, static_cast<int>(pass_keys.size() / 5));  // 10 draws a key
    const device::DeviceCounts before = engine.card_set.card(0).counts();
    const PassStats end = engine.manager->end_pass(passes[p].keep ? keep : std::vector<uint64_t>{});
    const device::DeviceCounts spent = engine.card_set.card(0).counts() - before;
    ASSERT_EQ(end.kept_dirty, passes[p].keep ? keep.size() : 0);
    ASSERT_GT(end.written_back, 3 * kBatch);
    EXPECT_EQ(spent.allocations, passes[p].allocations);
    EXPECT_EQ(spent.frees, passes[p].frees);
    EXPECT_EQ(spent.pinned_allocations, passes[p].pinned_allocations);
    EXPECT_EQ(spent.pinned_frees, passes[p].pinned_frees);
    EXPECT_EQ(spent.pageable_copies, 0u);
    EXPECT_EQ(spent.window_allocations, 0u);
    EXPECT_EQ(spent.stream_waits, stream_waits_of(engine, end.written_back));
    EXPECT_EQ(spent.copy_stream_copies, stages_rows(engine) ? parts_of(end.written_back) : 0u);
    // One wait a batch, the listing's two, the keys', the dirty flags'; kept keys add the row
    // indices' and two a page of them (the look-up's, the found rows').
    const uint64_t keep_pages = passes[p].keep ? (keep.size() + kPageRows - 1) / kPageRows : 0;
    EXPECT_EQ(spent.host_syncs, (end.written_back + kBatch - 1) / kBatch + 4 +
                                    (passes[p].keep ? 1 + 2 * keep_pages : 0));
  }
  // The pinned bytes reported: the keys (1.5 x 200 after growing once, then 1.5 x that), row
  // indices and keep page, and 3 batches of rows, or in place of their addresses.
  const std::size_t batches =
      3 * kBatch *
      (reads_rows_in_place(engine) ? sizeof(const float*)
                                   : engine.host->layout().stride() * sizeof(float));
  EXPECT_GT(engine.manager->current().write_back_pinned_bytes,
            batches + 300 * sizeof(uint64_t) + PassCards::keep_rows(kPageRows) * 12);
}

// The sparse optimizer and storage of InPlaceWritesTheGatheredRowsBitForBit's rows.
struct RowKind {
  const char* name;
  table::SparseOptimizerKind optimizer;
  table::SparseStorage storage;
};

// Issue 32: the cpu write-back pushes each dirty row where it lies on the card (HostTier::push_at
// by the rows' addresses) instead of gathering the rows into pinned batches first. Two engines
// over the same passes and steps, one gathering (write_back_in_place off: the path cuda takes)
// and one in place, with width classes (slot 1 at width 16, slot 2 at 2, the rest the record's
// 4: rows in pools of their own strides, narrower and wider than the default), so that a row read
// at a wrong address or in another pool shows (a read past a row's own width does not: the push
// stores only the width the row itself records). Each pass trains exactly `dirty` keys, so the
// write-back pushes 0, 1, a batch (n) and n + 1 rows, a page and one more, and many batches;
// every third pass keeps half of them dirty for the next. After each end_pass both host tiers
// equal the unordered_map oracle (the host rows before, the card rows of the keys written back),
// and so each other, bit for bit. Adagrad and Adam (its wider rows), fp32 and the 16-bit storages
// (two values a float). (Under GPUBOX_DEVICE_CHECK=defer both gather: reads_rows_in_place.)
class PassWriteBackInPlace : public ::testing::TestWithParam<RowKind> {};

TEST_P(PassWriteBackInPlace, InPlaceWritesTheGatheredRowsBitForBit) {
  table::AccessorConfig base = pass_test::test_config();
  base.optimizer.kind = GetParam().optimizer;
  base.storage = GetParam().storage;
  const table::AccessorConfig cfg = table::with_slot_dims(base, {{1, 16}, {2, 2}});
  PassManagerOptions gather_options = small_batches();
  gather_options.write_back_in_place = false;
  Engine gathered(1, gather_options, nullptr, small_pages(), cfg);
  Engine in_place(1, small_batches(), nullptr, small_pages(), cfg);
  ASSERT_EQ(in_place.stores[0]->pool_count(), 3);
  const std::vector<uint64_t> keys = make_passes(1, 64, 41)[0];
  std::vector<int32_t> slots(keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) slots[i] = static_cast<int32_t>(keys[i] % 3);
  const std::vector<std::size_t> sizes = {
      0, 1, kBatch, kBatch + 1, kPageRows, kPageRows + 1, 2 * kBatch + 1, 61, 64};
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    const std::size_t dirty = sizes[i];
    SCOPED_TRACE("pass " + std::to_string(i) + ": " + std::to_string(dirty) + " dirty rows");
    const std::vector<uint64_t> trained(keys.begin(), keys.begin() + dirty);
    std::vector<uint64_t> keep;
    if (i % 3 == 2) {
      for (std::size_t k = 0; k < dirty; k += 2) keep.push_back(trained[k]);
      std::sort(keep.begin(), keep.end());
    }
    std::vector<PassStats> ends;
    for (Engine* engine : {&gathered, &in_place}) {
      engine->manager->begin_pass(keys, slots);
      engine->train(trained, 300 + i, dirty == 0 ? 0 : 20);
      const Oracle oracle = expected_after_end(*engine, keep);
      const device::DeviceCounts before = engine->card_set.card(0).counts();
      ends.push_back(engine->manager->end_pass(keep));
      const device::DeviceCounts spent = engine->card_set.card(0).counts() - before;
      ASSERT_NO_FATAL_FAILURE(expect_host_holds(*engine, oracle));
      EXPECT_EQ(spent.stream_waits, stream_waits_of(*engine, ends.back().written_back));
    }
    EXPECT_EQ(ends[0].written_back, ends[1].written_back);
    EXPECT_EQ(ends[0].kept_dirty, ends[1].kept_dirty);
    EXPECT_EQ(ends[0].kept_dirty, keep.size());
    const auto want = gathered.host_rows();
    const auto got = in_place.host_rows();
    ASSERT_EQ(got.size(), want.size());
    for (const auto& [key, row] : got) {
      ASSERT_TRUE(want.count(key)) << "key " << key;
      ASSERT_TRUE(rows_equal(row, want.at(key)))
          << "key " << key << ": " << row_diff(row, want.at(key));
    }
  }
  // Every width was written back: a row of each of the three widths is on the host tier.
  std::set<int32_t> widths;
  const int32_t width_field = in_place.host->layout().mf_dim_offset();
  for (const auto& [key, row] : in_place.host_rows())
    widths.insert(static_cast<int32_t>(row[width_field]));
  EXPECT_EQ(widths, (std::set<int32_t>{2, 4, 16}));
}
INSTANTIATE_TEST_SUITE_P(
    PassWriteBack, PassWriteBackInPlace,
    ::testing::Values(
        RowKind{"AdagradFp32", table::SparseOptimizerKind::kAdagrad, table::SparseStorage::kFp32},
        RowKind{"AdagradFp16", table::SparseOptimizerKind::kAdagrad, table::SparseStorage::kFp16},
        RowKind{"AdagradBf16", table::SparseOptimizerKind::kAdagrad, table::SparseStorage::kBf16},
        RowKind{"AdamFp32", table::SparseOptimizerKind::kAdam, table::SparseStorage::kFp32}),
    [](const ::testing::TestParamInfo<RowKind>& info) { return std::string(info.param.name); });

// A host tier that takes no rows by address (HostTier::pushes_by_address false: a remote tier, a
// test wrapper) gets the rows gathered into pinned batches and pushed packed, even with
// write_back_in_place on: no per-batch heap copy, and the batches' bytes in
// write_back_pinned_bytes. Two engines over the same passes, one over the in-process table (in
// place on cpu), one over a wrapper of another (ForwardingHostTier, counting its pushed rows):
// the wrapper's push gets every row written back, its card orders each gathered part with 2
// stream waits, its pinned bytes exceed the other's by 3 batches of rows less 3 of addresses
// (none when both gather: cuda, GPUBOX_DEVICE_CHECK=defer), and both host tiers equal the oracle.
class CountingHost final : public table::testing::ForwardingHostTier {
 public:
  using ForwardingHostTier::ForwardingHostTier;
  Status push(const uint64_t* keys, std::size_t n, const float* rows) override {
    pushed_rows += n;
    return ForwardingHostTier::push(keys, n, rows);
  }
  std::atomic<uint64_t> pushed_rows{0};
};

TEST(PassWriteBack, ATierThatTakesNoAddressesGetsGatheredRows) {
  auto inner = table::SparseTable::open(pass_test::test_config(), table::HostTableConfig{});
  ASSERT_TRUE(inner.ok()) << inner.status().to_string();
  CountingHost wrapper(**inner);
  Engine wrapped(1, small_batches(), &wrapper, small_pages());
  wrapped.inspect = inner->get();
  Engine own(1, small_batches(), nullptr, small_pages());
  ASSERT_TRUE(wrapped.options.write_back_in_place);
  EXPECT_FALSE(reads_rows_in_place(wrapped));
  const std::vector<uint64_t> keys = make_passes(1, 64, 43)[0];
  for (const std::size_t dirty : {std::size_t{1}, kBatch + 1, std::size_t{64}}) {
    SCOPED_TRACE(std::to_string(dirty) + " dirty rows");
    const std::vector<uint64_t> trained(keys.begin(), keys.begin() + dirty);
    for (Engine* engine : {&wrapped, &own}) {
      engine->manager->begin_pass(keys);
      engine->train(trained, 500 + dirty, 20);
      const Oracle oracle = expected_after_end(*engine, {});
      const uint64_t pushed_before = wrapper.pushed_rows;
      const device::DeviceCounts before = engine->card_set.card(0).counts();
      const PassStats end = engine->manager->end_pass();
      const device::DeviceCounts spent = engine->card_set.card(0).counts() - before;
      ASSERT_NO_FATAL_FAILURE(expect_host_holds(*engine, oracle));
      EXPECT_EQ(end.written_back, dirty);
      if (engine == &wrapped) {
        EXPECT_EQ(wrapper.pushed_rows - pushed_before, dirty);
        EXPECT_EQ(spent.stream_waits, 2 * parts_of(dirty));
        EXPECT_EQ(spent.copy_stream_copies, stages_rows(*engine) ? parts_of(dirty) : 0u);
      }
    }
  }
  // Both hold 3 batch buffers (the last pass had 11 batches): of rows for the wrapper, of
  // addresses (8 bytes a row) for the in-process table when it takes them in place.
  const uint64_t row_bytes = wrapped.host->layout().stride() * sizeof(float);
  const uint64_t expected_extra =
      reads_rows_in_place(own) ? 3 * kBatch * (row_bytes - sizeof(const float*)) : 0;
  EXPECT_EQ(wrapped.manager->current().write_back_pinned_bytes -
                own.manager->current().write_back_pinned_bytes,
            expected_extra);
}

}  // namespace
}  // namespace gpubox::pass
