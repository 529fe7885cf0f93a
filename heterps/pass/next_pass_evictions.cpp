// NextPassWork's room-making phases (next_pass_work.hpp): kMark, kList and kErase, a chunk after
// a step each, without waiting for the card. When the next pass's missing keys would not fit the
// card's budget, the rows of both passes are marked, the table listed for the clean unmarked rows
// that leave first under the store's policy, and those erased; kInsert (next_pass_inserts.cpp)
// then fills the room made.
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "common/hash.hpp"
#include "heterps/card_table/card_store.hpp"
#include "heterps/pass/next_pass_work.hpp"

namespace gpubox::pass {

using card_table::row_index_t;

void NextPassWork::mark(int c, NextPassCard& next) {
  card_table::CardSparseStore& store = cards_.store(c);
  const device::Stream& stream = cards_.card(c).stream();
  const std::vector<uint64_t>& keys = *next.current_keys;
  const std::optional<ChunkChain::Chunk> chunk =
      next.at < keys.size() ? begin_chunk(c, next, SIZE_MAX) : std::nullopt;
  if (!chunk) {
    if (next.at == keys.size() && next.chain.in_flight() == 0) {
      // Every row has its mark and nothing inserts until kInsert: the room to make is fixed now.
      const std::size_t resident = store.size();
      const std::size_t budget = cards_.row_budget();
      next.victims = card_table::VictimHeap(
          resident + next.missing > budget ? resident + next.missing - budget : 0);
      next.at = 0;
      next.phase = NextPassCard::Phase::kList;
    }
    return;
  }
  // A window of the training pass's keys (shared, every card's): this card's among them, about
  // a chunk of them (the window spans a chunk per local card), at most a slot's worth.
  const std::size_t window =
      chunk->keys * static_cast<std::size_t>(cards_.cards().num_local_cards());
  const std::size_t stop = std::min(keys.size(), next.at + window);
  const int total_cards = cards_.cards().total_cards();
  const int first_rank = cards_.cards().trainer_id() * cards_.cards().num_local_cards();
  const std::size_t from = chunk->slot * next.slot_keys;
  uint64_t* mine = next.scratch.h_keys.data() + from;
  uint32_t* offsets = next.slot_offsets.data() + from;
  std::size_t n = 0;
  std::size_t k = next.at;
  for (; k < stop && n < next.slot_keys; ++k) {
    if (keys[k] == 0 || owner_card(keys[k], total_cards) - first_rank != c) continue;
    mine[n] = keys[k];
    offsets[n] = static_cast<uint32_t>(k);
    ++n;
  }
  next.at = k;
  next.slot_count[chunk->slot] = n;
  begin_work(c, next, *chunk);
  if (n > 0) {  // as lookup(): the table's find, the rows back into the slot of h_rows
    fit(c, next.scratch.d_keys, from + n);  // no allocation: expect() sized the slots
    fit(c, next.scratch.d_rows, from + n);
    device::copy_async(next.scratch.d_keys.data() + from, mine, n, stream);
    store.table().find(next.scratch.d_keys.data() + from, n, next.scratch.d_rows.data() + from,
                       stream);
    device::copy_async(next.scratch.h_rows.data() + from, next.scratch.d_rows.data() + from, n,
                       stream);
    ++next.readbacks;
  }
  end_chunk(c, next, *chunk, n);
}

void NextPassWork::read_marks(int c, NextPassCard& next, const ChunkChain::Chunk& chunk) {
  const std::size_t from = chunk.slot * next.slot_keys;
  const std::size_t n = next.slot_count[chunk.slot];
  if (n > 0) --next.readbacks;
  for (std::size_t i = 0; i < n; ++i) {
    const row_index_t row = next.scratch.h_rows[from + i];
    // Every key of the training pass is on the card (begin_pass placed it; nothing evicts it).
    GPUBOX_EXPECTS(row != card_table::kInvalidRow && row < next.marks.size(), "card ",
                   cards_.card(c).rank(), ": a key of the training pass is not on the card");
    if (next.marks[row] == 0) {  // not a row of the next pass
      next.spare_at.push_back(next.slot_offsets[from + i]);
      next.spare_rows.push_back(row);
    }
    next.marks[row] = 1;
  }
}

void NextPassWork::list(int c, NextPassCard& next) {
  card_table::CardSparseStore& store = cards_.store(c);
  const device::Stream& stream = cards_.card(c).stream();
  // Nothing inserts or erases until kErase: the table's slots stay where they are.
  const std::size_t slots = store.table().capacity();
  if (next.at == slots) {
    if (next.chain.in_flight() == 0) {  // every range read: the victims are chosen
      next.evicts_all_outside = !next.victims.passed_over();
      next.marks = {};
      next.at = 0;
      next.phase = NextPassCard::Phase::kErase;
    }
    return;
  }
  if (next.lists_started - next.lists_read == 2) return;  // both regions in flight
  // Slots are cheaper than keys (most are empty): 8 a key of the chunk.
  const std::optional<ChunkChain::Chunk> chunk = begin_chunk(c, next, (slots - next.at + 7) / 8);
  if (!chunk) return;
  const std::size_t end = std::min(slots, next.at + 8 * chunk->keys);
  const std::size_t from = (next.lists_started++ % 2) * next.list_room;
  const std::size_t room = from + (end - next.at) + 2;
  fit(c, next.scratch.d_keys, room);  // no allocation: expect() sized the regions
  fit(c, next.scratch.d_rows, room);
  fit(c, next.scratch.d_floats, room);
  fit(c, next.scratch.d_flags, room);
  begin_work(c, next, *chunk);
  const std::size_t count = store.list_slots_async(
      next.at, end, next.scratch.d_keys.data() + from, next.scratch.d_rows.data() + from,
      next.scratch.d_floats.data() + from, next.scratch.d_flags.data() + from, stream);
  device::copy_async(next.scratch.h_list_keys.data() + from, next.scratch.d_keys.data() + from,
                     count, stream);
  device::copy_async(next.scratch.h_list_rows.data() + from, next.scratch.d_rows.data() + from,
                     count, stream);
  device::copy_async(next.scratch.h_list_ranks.data() + from, next.scratch.d_floats.data() + from,
                     count, stream);
  device::copy_async(next.scratch.h_list_dirty.data() + from, next.scratch.d_flags.data() + from,
                     count, stream);
  ++next.readbacks;
  next.slot_count[chunk->slot] = count;
  const std::size_t listed = (end - next.at + 7) / 8;  // in keys: 8 slots a key
  next.at = end;
  end_chunk(c, next, *chunk, listed);
}

void NextPassWork::read_list(NextPassCard& next, const ChunkChain::Chunk& chunk) {
  const std::size_t from = (next.lists_read++ % 2) * next.list_room;
  const std::size_t count = next.slot_count[chunk.slot];
  --next.readbacks;
  // Those that leave first under the store's policy, as begin_pass chooses: as many as the next
  // pass lacks room for, or every candidate (begin_pass evicts the rest among the rows of this
  // pass it does not use). Chosen as the listing goes (card_table::VictimHeap), in slot order as
  // a compacted listing would give them, so the work of a chunk is bounded by its size and the
  // host holds no more candidates than will leave.
  for (std::size_t i = from; i < from + count; ++i) {
    const row_index_t row = next.scratch.h_list_rows[i];
    // Unmarked: in neither pass, so unused until begin_pass, and clean when end_pass kept only
    // the training pass's rows dirty (the trainer's `keep`); a dirty one (a wider `keep`) stays:
    // its newest value is only here. Nothing inserts between mark() and here, so every row has
    // a mark; one past them is not a candidate either. kInvalidRow: not a live slot.
    if (row == card_table::kInvalidRow || row >= next.marks.size() || next.marks[row] != 0 ||
        next.scratch.h_list_dirty[i] != 0) {
      continue;
    }
    next.victims.offer({next.scratch.h_list_ranks[i], next.scratch.h_list_keys[i], row});
  }
}

void NextPassWork::erase(int c, NextPassCard& next) {
  const device::Stream& stream = cards_.card(c).stream();
  // Their order does not matter.
  const std::vector<card_table::EvictionCandidate>& victims = next.victims.victims();
  const std::size_t left = victims.size() - next.at;
  if (left == 0) {
    if (next.chain.in_flight() == 0) {  // every erase checked
      next.victims.clear();
      next.at = 0;
      next.outside_gone = next.evicts_all_outside;
      next.phase = NextPassCard::Phase::kInsert;
    }
    return;
  }
  const std::optional<ChunkChain::Chunk> chunk = begin_chunk(c, next, left);
  if (!chunk) return;
  const std::size_t n = chunk->keys;
  const std::size_t from = chunk->slot * next.slot_keys;  // its slot of the scratch
  // The victims were listed live, are in neither pass (no step touches them) and nothing
  // inserted or erased since: each is on the card, once, so the erase needs no count back.
  // Each with the row it was listed at: the erase checks the table still holds it there.
  std::size_t reserved = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const uint64_t key = victims[next.at + i].key;
    next.scratch.h_keys[from + i] = key;
    next.scratch.h_rows[from + i] = victims[next.at + i].row;
    if (key == card_table::kEmptyKey || key == card_table::kErasedKey) ++reserved;
  }
  fit(c, next.scratch.d_keys, from + n);  // no allocation: expect() sized the slots
  fit(c, next.scratch.d_rows, from + n);
  begin_work(c, next, *chunk);
  device::copy_async(next.scratch.d_keys.data() + from, next.scratch.h_keys.data() + from, n,
                     stream);
  device::copy_async(next.scratch.d_rows.data() + from, next.scratch.h_rows.data() + from, n,
                     stream);
  cards_.store(c).erase_present_async(next.scratch.d_keys.data() + from,
                                      next.scratch.d_rows.data() + from, n, reserved,
                                      next.scratch.d_erase_check.data(), stream);
  fault_point(next, ChunkFault::kAfterTableCall);
  device::copy_async(next.scratch.h_erase_check.data() + chunk->slot,
                     next.scratch.d_erase_check.data(), 1, stream);
  ++next.readbacks;
  next.evicted += n;
  next.at += n;
  end_chunk(c, next, *chunk, n);
}

void NextPassWork::read_erase(int c, NextPassCard& next, const ChunkChain::Chunk& chunk) {
  --next.readbacks;
  const card_table::ErasePresentCheck check = next.scratch.h_erase_check[chunk.slot];
  if (check.missing == 0 && check.moved == 0) return;
  next.damaged = true;
  fail_erase(c, check);
}

void NextPassWork::fail_erase(int c, const card_table::ErasePresentCheck& check) const {
  std::string found = "not on the card";
  if (check.found_row != card_table::kInvalidRow) {
    found = "at row " + std::to_string(check.found_row);
  }
  GPUBOX_FAIL("card ", cards_.card(c).rank(), ": the next pass's card work erased victim key ",
              check.key, " listed at row ", check.planned_row, " but ", found, " (", check.missing,
              " victims not on the card, ", check.moved,
              " at another row): the card's table changed under the work since its listing, so "
              "its free list no longer holds what the work planned");
}

void NextPassWork::check_erases(int c, const NextPassCard& work) const {
  if (work.scratch.d_erase_check.empty() || work.evicted == 0) return;
  const device::Stream& stream = cards_.card(c).stream();
  const card_table::ErasePresentCheck check =
      device::to_host(work.scratch.d_erase_check.data(), 1, stream)[0];
  if (check.missing == 0 && check.moved == 0) return;
  fail_erase(c, check);
}

}  // namespace gpubox::pass
