// The wait-free forms the next pass's card work uses to insert and to erase (issue 31): against
// the forms that read counts back, on identical tables, and with their late checks planted.
//   - insert_new_async of keys known absent: the same rows, size, free list and later finds as
//     insert(), no wait and no allocation, *failed 0; a key that was present or met a probe run
//     past the bound is counted, and the documented repair (find, release_unused, insert again)
//     leaves the table as insert() leaves it.
//   - release_unused_async: what release_unused does, without its wait; purge_erased_for: erased
//     slots reclaimed at the same size when they keep the keys asked for out of the room, and
//     without an allocation in a lent RehashRoom.
//   - erase_present_async with the planned rows: a victim at its planned row passes; one at
//     another row (moved) or not there (missing) is counted and named with both rows.
//   - list_slots_async over ranges: as dump_range on the same table, and erase_present_async of
//     keys known present as erase(), on tables holding the reserved keys too.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "heterps/card_table/hash_table.cuh"
#include "heterps/device/card.hpp"
#include "heterps/device/memory.hpp"
#include "tests/heterps/card_table/hash_table_test_util.cuh"

namespace gpubox::card_table {
namespace {

using device::Card;
using device::CardSet;
using device::to_device;
using device::to_host;
using hash_table_test::BudgetedTable;
using hash_table_test::colliding_keys;
using hash_table_test::distinct_keys;
using hash_table_test::expect_same;
using hash_table_test::expect_same_finds;
using hash_table_test::free_list;

TEST(HashTableInsertNew, MatchesInsertWithoutAWaitOrAnAllocation) {
  CardSet cards = CardSet::from_list("0");
  Card& card = cards.card(0);
  const device::Stream& stream = card.stream();
  std::mt19937_64 rng(5);
  std::set<uint64_t> seen;
  const std::vector<uint64_t> old_keys = distinct_keys(rng, 300, &seen);
  CardHashTable eager(card, HashTableOptions{});
  CardHashTable late(card, HashTableOptions{});
  auto d_old = to_device(old_keys, card.memory(), stream);
  auto d_rows = card.make_buffer<row_index_t>(1000);
  for (CardHashTable* table : {&eager, &late}) {
    table->insert(d_old.data(), old_keys.size(), d_rows.data(), stream);
    table->erase(d_old.data(), 50, stream);  // erased slots and rows on the free list
  }
  std::vector<uint64_t> keys = old_keys;
  const std::vector<uint64_t> fresh = distinct_keys(rng, 400, &seen);
  keys.insert(keys.end(), fresh.begin(), fresh.end());
  auto d_fresh = to_device(fresh, card.memory(), stream);
  late.reserve(fresh.size(), stream);  // sized ahead, as the next pass's work does
  eager.reserve(fresh.size(), stream);
  ASSERT_GE(late.new_key_room(), fresh.size());
  auto failed = to_device(std::vector<uint32_t>{0}, card.memory(), stream);
  auto late_rows = card.make_buffer<row_index_t>(fresh.size());
  for (const std::size_t at : {std::size_t{0}, std::size_t{170}}) {
    const std::size_t n = at == 0 ? 170 : fresh.size() - 170;
    eager.insert(d_fresh.data() + at, n, d_rows.data() + at, stream);
    const device::DeviceCounts before = card.counts();
    late.insert_new_async(d_fresh.data() + at, n, late_rows.data() + at, failed.data(), stream);
    const device::DeviceCounts cost = card.counts() - before;
    EXPECT_EQ(cost.host_syncs, 0u);
    EXPECT_EQ(cost.allocations, 0u);
  }
  EXPECT_EQ(to_host(failed)[0], 0u);
  EXPECT_EQ(to_host(late_rows.data(), fresh.size(), stream),
            to_host(d_rows.data(), fresh.size(), stream));
  expect_same(eager, late, std::vector<uint64_t>(keys.begin() + 50, keys.end()), card);
  // More than the room without growth is refused (the caller sizes first).
  const std::size_t room = late.new_key_room();
  const std::vector<uint64_t> over = distinct_keys(rng, room + 1, &seen);
  auto d_over = to_device(over, card.memory(), stream);
  auto over_rows = card.make_buffer<row_index_t>(over.size());
  EXPECT_THROW(
      late.insert_new_async(d_over.data(), over.size(), over_rows.data(), failed.data(), stream),
      Error);
}

// The repair of a key that did not take its row: find the batch's keys, give back the rows that
// differ from those handed out, insert those keys again.
void repair(CardHashTable& table, const device::device_buffer<uint64_t>& d_keys,
            const std::vector<row_index_t>& handed, Card& card) {
  const device::Stream& stream = card.stream();
  const std::size_t n = handed.size();
  auto d_found = card.make_buffer<row_index_t>(n);
  table.find(d_keys.data(), n, d_found.data(), stream);
  const auto found = to_host(d_found);
  std::vector<row_index_t> unused;
  std::vector<uint64_t> again;
  const auto keys = to_host(d_keys);
  for (std::size_t i = 0; i < n; ++i) {
    if (found[i] == handed[i]) continue;
    unused.push_back(handed[i]);
    again.push_back(keys[i]);
  }
  auto d_unused = to_device(unused, card.memory(), stream);
  table.release_unused(d_unused.data(), unused.size(), stream);
  auto d_again = to_device(again, card.memory(), stream);
  auto again_rows = card.make_buffer<row_index_t>(again.size());
  table.insert(d_again.data(), again.size(), again_rows.data(), stream);
}

TEST(HashTableInsertNew, KeysThatCouldNotTakeTheirRowAreCountedAndRepaired) {
  CardSet cards = CardSet::from_list("0");
  Card& card = cards.card(0);
  const device::Stream& stream = card.stream();
  {
    SCOPED_TRACE("a key present after all");
    CardHashTable eager(card, HashTableOptions{});
    CardHashTable late(card, HashTableOptions{});
    const std::vector<uint64_t> first = {11, 12, 13};
    const std::vector<uint64_t> batch = {14, 12, 15};  // 12 is there
    auto d_first = to_device(first, card.memory(), stream);
    auto d_batch = to_device(batch, card.memory(), stream);
    auto rows = card.make_buffer<row_index_t>(3);
    eager.insert(d_first.data(), 3, rows.data(), stream);
    late.insert(d_first.data(), 3, rows.data(), stream);
    eager.insert(d_batch.data(), 3, rows.data(), stream);
    auto failed = to_device(std::vector<uint32_t>{0}, card.memory(), stream);
    late.insert_new_async(d_batch.data(), 3, rows.data(), failed.data(), stream);
    EXPECT_EQ(to_host(failed)[0], 1u);
    repair(late, d_batch, to_host(rows), card);
    expect_same(eager, late, {11, 12, 13, 14, 15}, card);
  }
  {
    SCOPED_TRACE("runs past the probe bound");
    HashTableOptions options;
    options.initial_capacity = 1024;
    CardHashTable eager(card, options);
    CardHashTable late(card, options);
    // One home slot in a table of 1024 slots: kMaxProbe of them fit, the rest overflow.
    const std::vector<uint64_t> keys = colliding_keys(2 * kMaxProbe, 12);
    eager.reserve(keys.size(), stream);
    late.reserve(keys.size(), stream);
    ASSERT_EQ(late.capacity(), 1024u) << "the keys would not collide at this size";
    auto d_keys = to_device(keys, card.memory(), stream);
    auto rows = card.make_buffer<row_index_t>(keys.size());
    eager.insert(d_keys.data(), keys.size(), rows.data(), stream);
    auto failed = to_device(std::vector<uint32_t>{0}, card.memory(), stream);
    late.insert_new_async(d_keys.data(), keys.size(), rows.data(), failed.data(), stream);
    EXPECT_EQ(to_host(failed)[0], keys.size() - kMaxProbe);
    repair(late, d_keys, to_host(rows), card);
    EXPECT_GT(late.capacity(), 1024u);
    EXPECT_EQ(late.capacity(), eager.capacity());
    expect_same(eager, late, keys, card);
  }
}

// One card and a table holding `n` distinct seeded keys (`seen` records them), placed by insert():
// the keys on the host and on the card, and the rows they took.
struct FilledTable {
  FilledTable(std::size_t n, uint64_t seed)
      : cards(CardSet::from_list("0")),
        card(cards.card(0)),
        stream(card.stream()),
        rng(seed),
        keys(distinct_keys(rng, n, &seen)),
        table(card, HashTableOptions{}),
        d_keys(to_device(keys, card.memory(), stream)),
        d_rows(card.make_buffer<row_index_t>(keys.size())) {
    table.insert(d_keys.data(), keys.size(), d_rows.data(), stream);
  }
  CardSet cards;
  Card& card;
  const device::Stream& stream;
  std::mt19937_64 rng;
  std::set<uint64_t> seen;
  const std::vector<uint64_t> keys;
  CardHashTable table;
  device::device_buffer<uint64_t> d_keys;
  device::device_buffer<row_index_t> d_rows;
};

TEST(HashTableErasePresent, NamesAVictimMissingOrAtAnotherRow) {
  FilledTable t(100, /*seed=*/9);
  const std::vector<row_index_t> rows = to_host(t.d_rows);
  auto check = to_device(std::vector<ErasePresentCheck>(1), t.card.memory(), t.stream);
  // Ten victims at their planned rows.
  t.table.erase_present_async(t.d_keys.data(), t.d_rows.data(), 10, 0, check.data(), t.stream);
  ErasePresentCheck got = to_host(check)[0];
  EXPECT_EQ(got.missing + got.moved + got.reported, 0u);
  // Keys[10] planned at keys[11]'s row: moved, named with both rows.
  auto planned = to_device(std::vector<row_index_t>{rows[11]}, t.card.memory(), t.stream);
  t.table.erase_present_async(t.d_keys.data() + 10, planned.data(), 1, 0, check.data(), t.stream);
  got = to_host(check)[0];
  EXPECT_EQ(got.moved, 1u);
  EXPECT_EQ(got.missing, 0u);
  EXPECT_EQ(got.reported, 1u);
  EXPECT_EQ(got.key, t.keys[10]);
  EXPECT_EQ(got.planned_row, rows[11]);
  EXPECT_EQ(got.found_row, rows[10]);
  // Keys[0] again (gone): missing; the first report stays.
  t.table.erase_present_async(t.d_keys.data(), t.d_rows.data(), 1, 0, check.data(), t.stream);
  got = to_host(check)[0];
  EXPECT_EQ(got.missing, 1u);
  EXPECT_EQ(got.moved, 1u);
  EXPECT_EQ(got.key, t.keys[10]);
  // A fresh check names the missing one.
  check = to_device(std::vector<ErasePresentCheck>(1), t.card.memory(), t.stream);
  t.table.erase_present_async(t.d_keys.data() + 1, t.d_rows.data() + 1, 1, 0, check.data(),
                              t.stream);
  got = to_host(check)[0];
  EXPECT_EQ(got.missing, 1u);
  EXPECT_EQ(got.key, t.keys[1]);
  EXPECT_EQ(got.planned_row, rows[1]);
  EXPECT_EQ(got.found_row, kInvalidRow);
}

// release_unused_async gives rows back as release_unused does (the same free list, size and
// finds after), with no wait and no allocation: the undo of an insert chunk cut short uses it
// between steps.
TEST(HashTableInsertNew, ReleaseUnusedAsyncMatchesReleaseUnused) {
  CardSet cards = CardSet::from_list("0");
  Card& card = cards.card(0);
  const device::Stream& stream = card.stream();
  CardHashTable eager(card, HashTableOptions{});
  CardHashTable late(card, HashTableOptions{});
  const std::vector<uint64_t> first = {11, 12, 13};
  const std::vector<uint64_t> batch = {14, 12, 15, 13};  // 12 and 13 are there
  auto d_first = to_device(first, card.memory(), stream);
  auto d_batch = to_device(batch, card.memory(), stream);
  auto rows = card.make_buffer<row_index_t>(batch.size());
  auto failed = to_device(std::vector<uint32_t>{0}, card.memory(), stream);
  for (CardHashTable* table : {&eager, &late}) {
    table->insert(d_first.data(), first.size(), rows.data(), stream);
    table->insert_new_async(d_batch.data(), batch.size(), rows.data(), failed.data(), stream);
  }
  const std::vector<row_index_t> handed = to_host(rows);
  auto unused = to_device(std::vector<row_index_t>{handed[1], handed[3]}, card.memory(), stream);
  eager.release_unused(unused.data(), 2, stream);
  const device::DeviceCounts before = card.counts();
  late.release_unused_async(unused.data(), 2, stream);
  const device::DeviceCounts cost = card.counts() - before;
  EXPECT_EQ(cost.host_syncs, 0u);
  EXPECT_EQ(cost.allocations, 0u);
  EXPECT_EQ(late.size(), 5u);
  expect_same(eager, late, {11, 12, 13, 14, 15}, card);
}

// purge_erased_for reclaims the erased slots, at the same size, exactly when they keep the keys
// asked for out of new_key_room(): 1024 slots (a load bound of 614), 500 keys and 100 erased
// slots leave room for 14; 14 keys purge nothing, 15 purge (room for 114 after), every key still
// found at its row.
TEST(HashTablePurge, ReclaimsErasedSlotsOnlyWhenTheyKeepKeysOut) {
  FilledTable t(600, /*seed=*/3);
  ASSERT_EQ(t.table.erase(t.d_keys.data(), 100, t.stream), 100u);
  ASSERT_EQ(t.table.capacity(), 1024u);
  ASSERT_GE(t.table.pool().free_count(), 114u);
  EXPECT_EQ(t.table.new_key_room(), 14u);
  t.table.purge_erased_for(14, t.stream);
  EXPECT_EQ(t.table.erased_slots(), 100u);
  t.table.purge_erased_for(15, t.stream);
  EXPECT_EQ(t.table.erased_slots(), 0u);
  EXPECT_EQ(t.table.capacity(), 1024u);
  EXPECT_EQ(t.table.size(), 500u);
  EXPECT_EQ(t.table.new_key_room(), 114u);
  auto found = t.card.make_buffer<row_index_t>(t.keys.size());
  t.table.find(t.d_keys.data(), t.keys.size(), found.data(), t.stream);
  std::vector<row_index_t> want = to_host(t.d_rows);
  std::fill(want.begin(), want.begin() + 100, kInvalidRow);
  EXPECT_EQ(to_host(found), want);
}

// A purge of erased slots in a RehashRoom (the pass boundary lends its kept listing) saves the
// live pairs there: no card allocation (its own pairs are two: checked first, with the scratch
// arena warmed by it), every live key keeps its row, the erased slots are gone.
TEST(HashTableMemory, PurgeInALentRoomAllocatesNothing) {
  const std::size_t budget = 2000;
  BudgetedTable t(budget);
  Card& card = t.card;
  CardHashTable& table = t.table;
  auto room_keys = card.make_buffer<uint64_t>(0);
  auto room_rows = card.make_buffer<row_index_t>(0);
  room_keys.reserve(budget);
  room_rows.reserve(budget);
  std::mt19937_64 rng(12);
  std::set<uint64_t> seen;
  std::vector<uint64_t> live;
  for (const bool lent : {false, true}) {
    SCOPED_TRACE(lent ? "lent room" : "own pairs");
    // Fill to the budget, then erase half: the tombstones keep 1500 more keys out.
    const auto keys = distinct_keys(rng, budget - live.size(), &seen);
    auto d_keys = to_device(keys, card.memory(), card.stream());
    auto d_rows = card.make_buffer<row_index_t>(keys.size());
    table.insert(d_keys.data(), keys.size(), d_rows.data(), card.stream());
    live.insert(live.end(), keys.begin(), keys.end());
    auto d_gone = to_device(std::vector<uint64_t>(live.begin(), live.begin() + budget / 2),
                            card.memory(), card.stream());
    table.erase(d_gone.data(), budget / 2, card.stream());
    live.erase(live.begin(), live.begin() + budget / 2);
    auto d_live = to_device(live, card.memory(), card.stream());
    auto d_before = card.make_buffer<row_index_t>(live.size());
    table.find(d_live.data(), live.size(), d_before.data(), card.stream());
    ASSERT_GT(table.erased_slots(), 0u);
    const device::DeviceCounts before = card.counts();
    table.purge_erased_for(budget - live.size(), card.stream(),
                           lent ? RehashRoom{&room_keys, &room_rows} : RehashRoom{});
    const device::DeviceCounts spent = card.counts() - before;
    EXPECT_EQ(table.erased_slots(), 0u);
    if (lent) {
      EXPECT_EQ(spent.allocations, 0u);
    } else {
      EXPECT_GE(spent.allocations, 2u);  // its pairs (and the scratch arena, warmed here)
    }
    auto d_after = card.make_buffer<row_index_t>(live.size());
    table.find(d_live.data(), live.size(), d_after.data(), card.stream());
    EXPECT_EQ(to_host(d_after), to_host(d_before));
    EXPECT_EQ(table.size(), live.size());
  }
}

// `table` listed by list_slots_async in ranges of 100 slots, the last one ending at capacity():
// each range's live entries (row != kInvalidRow), in order, are dump_range's output for the same
// range of the same table, the side slots after the last, and no range waits. Returns the live
// (key, row) pairs of every range.
std::map<uint64_t, row_index_t> list_in_ranges(const CardHashTable& table, Card& card) {
  const device::Stream& stream = card.stream();
  const std::size_t slots = table.capacity();
  auto dump_keys = card.make_buffer<uint64_t>(slots + 2);
  auto dump_rows = card.make_buffer<row_index_t>(slots + 2);
  auto all_keys = card.make_buffer<uint64_t>(slots + 2);
  auto all_rows = card.make_buffer<row_index_t>(slots + 2);
  std::map<uint64_t, row_index_t> listed;
  for (std::size_t begin = 0; begin < slots; begin += 100) {
    const std::size_t end = std::min(slots, begin + 100);
    SCOPED_TRACE("slots [" + std::to_string(begin) + ", " + std::to_string(end) + ")");
    const std::size_t count =
        table.dump_range(begin, end, dump_keys.data(), dump_rows.data(), stream);
    const device::DeviceCounts before = card.counts();
    const std::size_t entries =
        table.list_slots_async(begin, end, all_keys.data(), all_rows.data(), stream);
    EXPECT_EQ((card.counts() - before).host_syncs, 0u);
    EXPECT_EQ(entries, end - begin + (end == slots ? 2 : 0));
    const auto got_keys = to_host(all_keys.data(), entries, stream);
    const auto got_rows = to_host(all_rows.data(), entries, stream);
    std::vector<uint64_t> live_keys;
    std::vector<row_index_t> live_rows;
    for (std::size_t i = 0; i < entries; ++i) {
      if (got_rows[i] == kInvalidRow) continue;
      live_keys.push_back(got_keys[i]);
      live_rows.push_back(got_rows[i]);
      EXPECT_TRUE(listed.emplace(got_keys[i], got_rows[i]).second) << "key " << got_keys[i];
    }
    EXPECT_EQ(live_keys, to_host(dump_keys.data(), count, stream));
    EXPECT_EQ(live_rows, to_host(dump_rows.data(), count, stream));
  }
  return listed;
}

// The wait-free forms the next pass's card work uses (issue 31, item 4), against the forms that
// read counts back, on two identical tables holding the reserved keys too:
//   - list_slots_async over ranges: as dump_range on the same table (list_in_ranges), and both
//     tables list the same (key, row) pairs. Which slot a key takes depends on how concurrent
//     inserts interleave (on a GPU two tables given the same batch placed colliding keys in
//     other orders), so the tables are compared as maps, not slot by slot;
//   - erase_present_async of keys known present: the same size, erased slots, free list and
//     later rows as erase() (a following insert takes the same rows), no wait, check->missing
//     0; a key not there is counted in check->missing and named.
TEST(HashTableWaitFree, ListSlotsAndErasePresentMatchTheFormsThatReadBack) {
  CardSet cards = CardSet::from_list("0");
  Card& card = cards.card(0);
  const device::Stream& stream = card.stream();
  std::mt19937_64 rng(41);
  std::vector<uint64_t> keys = {kEmptyKey, kErasedKey, 0};
  std::set<uint64_t> seen(keys.begin(), keys.end());
  while (keys.size() < 700) {
    const uint64_t k = rng() % 100000;
    if (seen.insert(k).second) keys.push_back(k);
  }
  CardHashTable eager(card, HashTableOptions{});
  CardHashTable late(card, HashTableOptions{});
  auto d_keys = to_device(keys, card.memory(), stream);
  auto d_rows = card.make_buffer<row_index_t>(keys.size());
  eager.insert(d_keys.data(), keys.size(), d_rows.data(), stream);
  const std::vector<row_index_t> rows = to_host(d_rows);
  late.insert(d_keys.data(), keys.size(), d_rows.data(), stream);
  EXPECT_EQ(to_host(d_rows), rows);  // the same rows; the slots may differ
  std::map<uint64_t, row_index_t> inserted;
  for (std::size_t i = 0; i < keys.size(); ++i) inserted.emplace(keys[i], rows[i]);
  EXPECT_EQ(list_in_ranges(late, card), inserted);
  EXPECT_EQ(list_in_ranges(eager, card), inserted);
  // Erasing 300 keys, both reserved keys among them, in two batches.
  std::vector<uint64_t> victims(keys.begin(), keys.begin() + 300);
  std::shuffle(victims.begin(), victims.end(), rng);
  auto d_victims = to_device(victims, card.memory(), stream);
  auto check = to_device(std::vector<ErasePresentCheck>(1), card.memory(), stream);
  std::size_t at = 0;
  for (const std::size_t n : {std::size_t{170}, std::size_t{130}}) {
    std::size_t reserved = 0;
    for (std::size_t i = at; i < at + n; ++i) reserved += victims[i] >= kErasedKey ? 1 : 0;
    EXPECT_EQ(eager.erase(d_victims.data() + at, n, stream), n);
    const device::DeviceCounts before = card.counts();
    late.erase_present_async(d_victims.data() + at, nullptr, n, reserved, check.data(), stream);
    EXPECT_EQ((card.counts() - before).host_syncs, 0u);
    EXPECT_EQ(late.size(), eager.size());
    EXPECT_EQ(late.erased_slots(), eager.erased_slots());
    EXPECT_EQ(late.pool().free_count(), eager.pool().free_count());
    at += n;
  }
  EXPECT_EQ(to_host(check)[0].missing, 0u);
  EXPECT_EQ(to_host(check)[0].reported, 0u);
  EXPECT_EQ(free_list(late, stream), free_list(eager, stream));
  // The rows the next keys take (the free list's order) and every key's row agree.
  std::vector<uint64_t> fresh;
  for (uint64_t k = 200000; fresh.size() < 250; ++k) fresh.push_back(k);
  auto d_fresh = to_device(fresh, card.memory(), stream);
  auto eager_rows = card.make_buffer<row_index_t>(fresh.size());
  auto late_rows = card.make_buffer<row_index_t>(fresh.size());
  eager.insert(d_fresh.data(), fresh.size(), eager_rows.data(), stream);
  late.insert(d_fresh.data(), fresh.size(), late_rows.data(), stream);
  EXPECT_EQ(to_host(late_rows), to_host(eager_rows));
  expect_same_finds(eager, late, keys, card);
  // A key that is not there is counted, for the caller's late check.
  const std::vector<uint64_t> absent = {999999999};
  auto d_absent = to_device(absent, card.memory(), stream);
  late.erase_present_async(d_absent.data(), nullptr, 1, 0, check.data(), stream);
  const ErasePresentCheck got = to_host(check)[0];
  EXPECT_EQ(got.missing, 1u);
  EXPECT_EQ(got.moved, 0u);
  EXPECT_EQ(got.reported, 1u);
  EXPECT_EQ(got.key, absent[0]);
  EXPECT_EQ(got.found_row, kInvalidRow);
}

}  // namespace
}  // namespace gpubox::card_table
