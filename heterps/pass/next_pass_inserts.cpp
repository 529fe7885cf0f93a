// NextPassWork's kInsert phase and its late reads (next_pass_work.hpp): the next pass's staged
// rows inserted into the room made, a chunk after a step, without waiting for the card.
#include <algorithm>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "common/error_report.hpp"
#include "common/logging.hpp"
#include "heterps/card_table/card_store.hpp"
#include "heterps/pass/next_pass_work.hpp"

namespace gpubox::pass {

using card_table::row_index_t;

void NextPassWork::reserve_inserts(int c, std::size_t keys) {
  card_table::CardSparseStore& store = cards_.store(c);
  const std::size_t budget = cards_.row_budget();
  // Between begin_pass and the steps: a rehash saves its pairs in the kept listing, free then.
  CardPassBuffers& lent = cards_.kept(c);
  const card_table::RehashRoom pairs{&lent.listed_keys, &lent.listed_rows};
  if (budget > 0) {
    // The table was sized once for the budget; the erased slots of every eviction since its
    // last rehash count against its load bound, and no chunk may reclaim them between steps: so
    // now, when they would keep the inserts out. The work evicts before it inserts, so up to
    // `keys` may go in whatever room the budget has now. What the work's own evictions erase
    // stays counted until the next boundary: the inserts still stop at the load bound.
    store.purge_erased_for(keys, cards_.card(c).stream(), pairs);
  }
  const std::size_t room = budget > 0 ? budget - std::min(budget, store.size()) : keys;
  const std::size_t n = std::min(keys, room);
  if (n == 0 || store.new_key_room() >= n) return;
  // Slots for the keys (a purge of erased slots, or growth without a budget) and free rows.
  store.reserve(n, cards_.card(c).stream(), pairs);
}

std::size_t NextPassWork::inserts_left(int c, const NextPassCard& next) const {
  const std::size_t left = next.used.size() - next.inserted;
  const std::size_t budget = cards_.row_budget();
  if (budget == 0) return left;
  // The store's size counts the chunks in flight already.
  return std::min(left, budget - std::min(budget, cards_.store(c).size()));
}

std::size_t NextPassWork::insert_count(int c, const NextPassCard& next) const {
  // Within the room the table and the pool have now: growing them would need a wait for the
  // card (a step's collectives may be in flight: device rule 1) and an allocation mid-pass.
  return std::min({next.chain.pacer().keys(), next.insert_room, inserts_left(c, next),
                   cards_.store(c).new_key_room()});
}

void NextPassWork::insert(int c, NextPassCard& next) {
  const std::size_t want = insert_count(c, next);
  if (want == 0) {
    // No room left (begin_pass evicts rows of this pass first, and grows what expect() sized
    // short) or every staged row in: done once every chunk is read.
    if (next.chain.in_flight() == 0) next.phase = NextPassCard::Phase::kDone;
    return;
  }
  if (next.inserts_started - next.inserts_read == 2) return;  // both record regions in flight
  const std::optional<ChunkChain::Chunk> chunk = begin_chunk(c, next, want);
  if (!chunk) return;
  card_table::CardSparseStore& store = cards_.store(c);
  const device::Stream& stream = cards_.card(c).stream();
  const std::size_t n = chunk->keys;
  // Keys known missing (looked up, and nothing but this work inserts) and distinct: each takes
  // its candidate row, so nothing is read back before the next chunk.
  const StagedRows& staged = *next.staged;
  const std::size_t stride = cards_.stride();
  const std::size_t first = c > 0 ? staged.card_end[c - 1] : 0;
  const std::size_t from = chunk->slot * next.slot_keys;
  const std::size_t region = (next.inserts_started++ % 2) * next.insert_room * stride;
  float* records = next.scratch.h_records.data() + region;
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t at = first + next.used[next.inserted + i];
    next.scratch.h_keys[from + i] = staged.keys[at];
    std::copy_n(staged.rows.data() + at * stride, stride, records + i * stride);
  }
  fit(c, next.scratch.d_keys, from + n);  // no allocation: expect() sized the slots and regions
  fit(c, next.scratch.d_rows, from + n);
  fit(c, next.scratch.d_floats, region + n * stride);
  begin_work(c, next, *chunk);
  uint64_t* d_keys = next.scratch.d_keys.data() + from;
  row_index_t* d_rows = next.scratch.d_rows.data() + from;
  uint32_t* d_failed = next.scratch.d_failed.data() + chunk->slot;
  device::copy_async(d_keys, next.scratch.h_keys.data() + from, n, stream);
  device::copy_async(next.scratch.d_floats.data() + region, records, n * stride, stream);
  device::memset_bytes_async(d_failed, 0, sizeof(uint32_t), stream);
  store.insert_new_rows_async(d_keys, next.scratch.d_floats.data() + region, n, d_rows, d_failed,
                              stream);
  fault_point(next, ChunkFault::kAfterTableCall);
  device::copy_async(next.scratch.h_rows.data() + from, d_rows, n, stream);
  device::copy_async(next.scratch.h_failed.data() + chunk->slot, d_failed, 1, stream);
  ++next.readbacks;
  next.slot_count[chunk->slot] = n;
  next.inserted += n;
  end_chunk(c, next, *chunk, n);
}

void NextPassWork::read_insert(int c, NextPassCard& next, const ChunkChain::Chunk& chunk) {
  --next.readbacks;
  const std::size_t region = (next.inserts_read++ % 2) * next.insert_room * cards_.stride();
  if (next.scratch.h_failed[chunk.slot] != 0) {
    try {
      repair_insert(c, next, chunk, region);
    } catch (...) {
      // Stopped part way, the repair cannot be run again (its rows may be released already):
      // the free list and the keys' count are not known, and the job stops.
      next.damaged = true;
      throw;
    }
  }
  const std::size_t from = chunk.slot * next.slot_keys;
  const std::size_t n = next.slot_count[chunk.slot];
  // Their rows are the next pass's too: begin_pass spares them if it still evicts.
  next.hit_rows.insert(next.hit_rows.end(), next.scratch.h_rows.data() + from,
                       next.scratch.h_rows.data() + from + n);
}

void NextPassWork::repair_insert(int c, NextPassCard& next, const ChunkChain::Chunk& chunk,
                                 std::size_t region) {
  card_table::CardSparseStore& store = cards_.store(c);
  device::Card& card = cards_.card(c);
  const device::Stream& stream = card.stream();
  const std::size_t stride = cards_.stride();
  const std::size_t n = next.slot_count[chunk.slot];
  const uint64_t* keys = next.scratch.h_keys.data() + chunk.slot * next.slot_keys;
  row_index_t* rows = next.scratch.h_rows.data() + chunk.slot * next.slot_keys;
  const float* records = next.scratch.h_records.data() + region;
  // Rare (a key present after all, or a probe run past the bound): a wait, bounded as the
  // step's own (a step's collectives may be in flight), so that nothing is in flight while the
  // table may grow (device rule 1). The keys whose row is not the one they were given did not
  // take it: those rows go back to the free list, and the keys are inserted again. That insert
  // stays within what expect() reserved (the chunks were enqueued within new_key_room() and the
  // rows not taken go back first, so its reserve needs no more slots or rows) but for one
  // case: a key whose probe run passes kMaxProbe, for which CardHashTable::insert doubles the
  // table until it fits. No reservation can promise that away (the run depends on the keys'
  // homes; a same-size purge shortens it only where erased slots lie in it). Its wait and its
  // allocations (these buffers, the table's scratch, a growth) count as the work's
  // (early_host_syncs, early_allocations).
  wait_for_card(c, "a repair of keys that did not take their row");
  auto d_keys = device::to_device(std::vector<uint64_t>(keys, keys + n), card.memory(), stream);
  auto d_found = card.make_buffer<row_index_t>(n);
  store.table().find(d_keys.data(), n, d_found.data(), stream);
  const std::vector<row_index_t> found = device::to_host(d_found.data(), n, stream);
  std::vector<row_index_t> unused;
  std::vector<uint64_t> again;
  std::vector<float> again_rows;
  for (std::size_t i = 0; i < n; ++i) {
    if (found[i] == rows[i]) continue;
    unused.push_back(rows[i]);
    again.push_back(keys[i]);
    again_rows.insert(again_rows.end(), records + i * stride, records + (i + 1) * stride);
  }
  GPUBOX_LOG(WARNING) << "card " << card.rank() << ": " << again.size()
                      << " of the next pass's keys did not take their row between steps (a "
                         "probe run past the table's bound): inserted again after a wait";
  const auto d_unused = device::to_device(unused, card.memory(), stream);
  store.release_unused_rows(d_unused.data(), unused.size(), stream);
  const auto d_again = device::to_device(again, card.memory(), stream);
  const auto d_again_rows = device::to_device(again_rows, card.memory(), stream);
  store.insert_rows(d_again.data(), d_again_rows.data(), again.size(), stream);
  store.table().find(d_keys.data(), n, d_found.data(), stream);
  const std::vector<row_index_t> now = device::to_host(d_found.data(), n, stream);
  std::copy(now.begin(), now.end(), rows);
}

void NextPassWork::read_in_flight(int c, NextPassCard& work) {
  using Phase = NextPassCard::Phase;
  if (work.chain.in_flight() == 0 ||
      (work.phase != Phase::kErase && work.phase != Phase::kInsert)) {
    return;
  }
  // Every chunk's end event has passed: the bounded wait, as the step's collectives before the
  // chunks may be pending and a peer that never joins them must fail the pass, not hang it.
  wait_for_card(c, "its chunks in flight at the pass boundary");
  collect(c, work);  // a victim not where it was listed throws here
}

void NextPassWork::drain_after_fault(int c, NextPassCard& work, NextPassCard::Phase phase) {
  using Phase = NextPassCard::Phase;
  ChunkChain& chain = work.chain;
  const bool cut_short = work.chunk_open;
  work.injected_fault = false;
  if (chain.in_flight() > 0 || work.readbacks > 0) {
    // Every chunk enqueued before the fault has passed (their readbacks into pinned memory
    // too): the stream, not an end event, as the chunk cut short never recorded its own. The
    // step's collectives before them may be pending: the bounded wait, which fails naming the
    // card and the pass when a peer never joins them, instead of hanging.
    wait_for_card(c, "the chunks in flight when a fault stopped it");
  }
  // Only now: should the wait throw, the chunk stays open, so keep_scratch does not take the
  // newest end event (never recorded for it) for the end of what is in flight.
  work.chunk_open = false;
  work.readbacks = 0;
  if (cut_short && chain.in_flight() > 0) {
    // First, while the store's count has moved by its table call alone.
    if (phase == Phase::kInsert) undo_cut_insert(c, work, chain.newest());
    if (phase == Phase::kErase) {
      // Its erase ran when the count moved: those victims left (counted); the check is read
      // below.
      work.evicted += work.table_size_at_open - cards_.store(c).size();
    }
  }
  // The chunks enqueued whole: an insert's keys that did not take their row repaired (their
  // rows back on the free list, the count right), an erase's check read (a victim not where it
  // was listed stops the job). Look-ups, marks and listings changed nothing.
  while (chain.in_flight() > (cut_short ? 1u : 0u)) {
    const ChunkChain::Chunk chunk = chain.oldest();
    if (phase == Phase::kInsert) read_insert(c, work, chunk);
    if (phase == Phase::kErase) read_erase(c, work, chunk);
    chain.retire(std::nullopt);
  }
  if (chain.in_flight() > 0) chain.retire(std::nullopt);  // the one cut short
  if (phase == Phase::kErase) check_erases(c, work);
}

void NextPassWork::undo_cut_insert(int c, NextPassCard& work, const ChunkChain::Chunk& chunk) {
  card_table::CardSparseStore& store = cards_.store(c);
  // The fault came before the table call: nothing to undo.
  if (store.size() == work.table_size_at_open) return;
  const device::Stream& stream = cards_.card(c).stream();
  // insert_new_async counted its n keys and took n candidate rows, handing key i row i
  // (d_rows, written on the card): a key found at its row took it.
  const std::size_t n = store.size() - work.table_size_at_open;
  // Between steps, as the chunk was: no allocation and no pageable copy. The chunk's slot holds
  // its keys (d_keys, h_keys) and given rows (d_rows; its readbacks were never enqueued, so its
  // h_rows is free); the slot after it is no chunk's in flight (slots are taken in turn, and at
  // most two insert chunks are in flight), so it takes what the chunk's slot cannot.
  if (work.chain.in_flight() >= work.chain.depth()) {
    // Nothing undone: the store counts keys the card may not hold, as a failed undo would.
    work.damaged = true;
    GPUBOX_FAIL("card ", cards_.card(c).rank(), ": the next pass's card work during pass ",
                pass_id_,
                " has no free scratch slot to undo an insert chunk cut short by a fault (",
                work.chain.in_flight(), " of ", work.chain.depth(), " in flight)");
  }
  const std::size_t from = chunk.slot * work.slot_keys;
  const std::size_t spare = (chunk.slot + 1) % work.chain.depth() * work.slot_keys;
  fit(c, work.scratch.d_keys, spare + n);
  fit(c, work.scratch.d_rows, spare + n);
  row_index_t* given = work.scratch.h_rows.data() + from;
  row_index_t* found = work.scratch.h_rows.data() + spare;
  device::copy_async(given, work.scratch.d_rows.data() + from, n, stream);
  store.table().find(work.scratch.d_keys.data() + from, n, work.scratch.d_rows.data() + spare,
                     stream);
  device::copy_async(found, work.scratch.d_rows.data() + spare, n, stream);
  wait_for_card(c, "the rows of an insert chunk cut short by a fault");
  // Split in place (each index written is at most the one read): the keys that took their row,
  // with it, to the spare slot; the rows nobody took to the front of the chunk's slot.
  const uint64_t* keys = work.scratch.h_keys.data() + from;
  uint64_t* took_keys = work.scratch.h_keys.data() + spare;
  std::size_t took = 0;
  std::size_t unused = 0;
  std::size_t reserved = 0;  // kEmptyKey, kErasedKey: side slots, no tombstone when erased
  for (std::size_t i = 0; i < n; ++i) {
    const row_index_t row = given[i];
    if (found[i] != row) {
      given[unused++] = row;
      continue;
    }
    took_keys[took] = keys[i];
    found[took++] = row;
    if (keys[i] == card_table::kEmptyKey || keys[i] == card_table::kErasedKey) ++reserved;
  }
  device::copy_async(work.scratch.d_rows.data() + from, given, unused, stream);
  store.release_unused_rows_async(work.scratch.d_rows.data() + from, unused, stream);
  // The keys that took their row leave again, each known present at its row: erase() without
  // its readback and scratch, checked on the card.
  device::copy_async(work.scratch.d_keys.data() + spare, took_keys, took, stream);
  device::copy_async(work.scratch.d_rows.data() + spare, found, took, stream);
  store.erase_present_async(work.scratch.d_keys.data() + spare, work.scratch.d_rows.data() + spare,
                            took, reserved, work.scratch.d_erase_check.data(), stream);
  device::copy_async(work.scratch.h_erase_check.data() + chunk.slot,
                     work.scratch.d_erase_check.data(), 1, stream);
  wait_for_card(c, "the undo of an insert chunk cut short by a fault");
  const card_table::ErasePresentCheck check = work.scratch.h_erase_check[chunk.slot];
  if (check.missing != 0 || check.moved != 0) {
    work.damaged = true;
    GPUBOX_FAIL("card ", cards_.card(c).rank(), ": the next pass's card work during pass ",
                pass_id_, ", undoing an insert chunk cut short by a fault: key ", check.key,
                " was not at row ", check.planned_row, " (", check.missing, " keys gone, ",
                check.moved, " at another row): the card's free list is damaged");
  }
  // The store's count is back at table_size_at_open by construction (unused + took == n): the
  // card's own word is the check above.
}

void NextPassWork::wait_for_card(int c, const char* what) const {
  const auto context = [&] {
    return detail::concat("card ", cards_.card(c).rank(),
                          ": the next pass's card work during pass ", pass_id_,
                          " could not wait for ", what, ": ");
  };
  try {
    cards_.wait_between_steps(c, what);
  } catch (const Error& e) {
    // The wait's own message (the communicator's names the pass and step) after the context,
    // its location kept apart (error_report.hpp).
    throw_with_context(context(), e);
  } catch (const std::exception& e) {
    throw Error(context() + e.what());
  }
}

void NextPassWork::finish(int c, NextPassCard& work) {
  read_in_flight(c, work);
  check_erases(c, work);
}

void NextPassWork::settle(int c) {
  if (static_cast<std::size_t>(c) < cards_work_.size()) {
    read_in_flight(c, cards_work_[static_cast<std::size_t>(c)]);
  }
}

}  // namespace gpubox::pass
