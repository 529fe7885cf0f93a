// NextPassWork (next_pass_work.hpp): expecting and taking the work, the chunks every phase runs
// in (their scratch, the chain of chunks in flight, the injected faults), and kWaiting and
// kLookup. The room-making phases are in next_pass_evictions.cpp, kInsert and the reads after a
// fault in next_pass_inserts.cpp.
#include "heterps/pass/next_pass_work.hpp"

#include <algorithm>
#include <exception>
#include <optional>
#include <type_traits>
#include <utility>

#include "common/error.hpp"
#include "common/logging.hpp"
#include "common/timer.hpp"
#include "heterps/card_table/card_store.hpp"

namespace gpubox::pass {

using card_table::row_index_t;

namespace {

// NextPassScratch's pinned buffers, each with its entries for `sizes`: the one list that
// lend_scratch makes them from, NextPassScratchSizes::pinned_bytes (the plan's term) sums and
// NextPassScratch::pinned_bytes reads back, so no buffer is made and left out of the plan.
template <class Visit>
void for_each_pinned(const NextPassScratchSizes& sizes, Visit&& visit) {
  const std::size_t depth = ChunkChain::kDepth;
  visit(&NextPassScratch::h_keys, sizes.chunk * depth);
  visit(&NextPassScratch::h_rows, sizes.chunk * depth);
  visit(&NextPassScratch::h_list_keys, 2 * sizes.list_room);
  visit(&NextPassScratch::h_list_rows, 2 * sizes.list_room);
  visit(&NextPassScratch::h_list_ranks, 2 * sizes.list_room);
  visit(&NextPassScratch::h_list_dirty, 2 * sizes.list_room);
  visit(&NextPassScratch::h_erase_check, depth);
  visit(&NextPassScratch::h_failed, depth);
  visit(&NextPassScratch::h_records, sizes.records);
}

// The bytes of an entry of one of NextPassScratch's pinned buffers.
template <class T>
constexpr std::size_t entry_bytes(device::pinned_buffer<T> NextPassScratch::*) {
  return sizeof(T);
}

}  // namespace

std::vector<NextPassCard> NextPassWork::take() {
  std::vector<NextPassCard> taken = std::move(cards_work_);
  cards_work_.clear();
  keys_changed();
  prepared_in_pass_.store(false, std::memory_order_relaxed);  // a new pass: no step yet
  return taken;
}

void NextPassWork::expect(std::shared_ptr<const std::vector<uint64_t>> current_keys,
                          const std::function<StagingProgress()>& poll, bool training,
                          int64_t pass_id) {
  // Before anything is cleared or sized: the work's chunks may be in flight, and the sizing
  // waits for the cards (a purge, a growth), which beside a step's collectives could hang
  // (device rule 1). The trainer calls prepare_next_pass after each step: none yet.
  GPUBOX_EXPECTS(!training || !prepared_in_pass_.load(std::memory_order_relaxed),
                 "expect_next_pass: pass ", pass_id,
                 " has run steps already (prepare_next_pass was called since its begin_pass); "
                 "call it after begin_pass, before the first step");
  keep_idle_scratch();
  cards_work_.clear();
  pass_id_ = pass_id;
  if (!poll || current_keys == nullptr || !training || !next_pass_work_possible(cards_.shape()))
    return;
  // The rows of the current pass the next one lacks are kept as 32-bit offsets in its keys.
  GPUBOX_EXPECTS(current_keys->size() <= UINT32_MAX, "expect_next_pass: ", current_keys->size(),
                 " keys in the training pass, over 2^32");
  cards_work_.resize(cards_.num_cards());
  // Each card's scratch on its own thread (its pinned memory counted on its card).
  cards_.cards().run_on_cards([&](device::Card& card) {
    NextPassCard& next = cards_work_[static_cast<std::size_t>(card.local_index())];
    next.phase = NextPassCard::Phase::kWaiting;
    next.poll = poll;  // a copy per card thread
    next.current_keys = current_keys;
    next.generation = generation_;
    lend_scratch(card.local_index(), next);
  });
  // The tables and pools are sized now for the next pass's inserts (no collective in flight
  // between passes): no insert chunk grows them (they stop at the room there is). For its
  // staged keys on the card when they are planned already: a bound, exact when the staging
  // excluded the keys on the cards (the trainer's does: pass_pipeline.cpp), which only the
  // work's own look-ups could tell otherwise. Else (the trainer's pipeline plans the next pass
  // during this one) for the new keys this pass brought to the card (early or at its
  // begin_pass) and an eighth: a pass of fresh keys brings about the last one's count, a little
  // more or less (after the first pass: an eighth of its keys, see note_pass_missing). Inserts
  // past the room wait for the next begin_pass; the rows left over serve later passes' new keys
  // (capped by the budget).
  // One poll for every card: a poll may count its calls.
  const StagedRows* staged = poll().staged;
  const bool planned = staged != nullptr && staged->owned.size() == cards_.num_cards();
  // Each card on its own thread: a purge or a growth synchronizes its card alone.
  cards_.cards().run_on_cards([&](device::Card& card) {
    const auto c = static_cast<std::size_t>(card.local_index());
    const std::size_t guess = pass_missing_[c] + pass_missing_[c] / 8;
    const std::size_t first = c > 0 && planned ? staged->card_end[c - 1] : 0;
    reserve_inserts(static_cast<int>(c), planned ? staged->card_end[c] - first : guess);
  });
}

bool next_pass_work_possible(const PassManagerOptions& options, int32_t pools, int local_cards,
                             int total_cards) {
  // With several trainers nothing is staged (a card's keys come from every trainer's data), so
  // the work would never start: nothing is sized for it either.
  const bool several_trainers = total_cards != local_cards;
  return options.next_pass_chunk_keys > 0 &&
         options.placement != heter_comm::Placement::kReplicated && pools == 1 && !several_trainers;
}

bool next_pass_work_possible(const CardTierShape& shape) {
  return next_pass_work_possible(shape.options, shape.store->pool_count(), shape.local_cards,
                                 shape.total_cards);
}

NextPassScratchSizes next_pass_scratch_sizes(const CardTierShape& shape, std::size_t rows) {
  NextPassScratchSizes sizes;
  sizes.chunk = shape.options.next_pass_chunk_keys;
  if (rows > 0) {
    sizes.chunk = std::min(
        sizes.chunk, std::max(std::min(ChunkPacer::kMinKeys, rows), rows / kBudgetRowsPerChunkKey));
  }
  const std::size_t chunk = sizes.chunk;
  // kLookup, kErase, kInsert: a chunk a slot (kInsert's records: below); under a budget kMark: a
  // window of a chunk per local card, kList: two regions of 8 slots a key (+ 2: the side slots).
  sizes.keys = chunk * ChunkChain::kDepth;
  if (rows > 0) {
    sizes.list_room = 8 * chunk + 2;
    const std::size_t listed = 2 * sizes.list_room;
    sizes.keys =
        std::max({sizes.keys, chunk * static_cast<std::size_t>(shape.local_cards), listed});
    sizes.floats = listed;
    sizes.flags = listed;
  }
  // kInsert: two regions of staged records, a chunk's or a page's (the smaller), on the card and
  // pinned; under a budget half a chunk's (a record is a row: it would be most of the scratch).
  const std::size_t insert_chunk = rows > 0 ? std::max<std::size_t>(1, chunk / 2) : chunk;
  sizes.insert_room = std::min(insert_chunk, shape.store->page_rows());
  sizes.records = 2 * sizes.insert_room * shape.stride();
  sizes.floats = std::max(sizes.floats, sizes.records);
  return sizes;
}

std::size_t NextPassScratchSizes::card_bytes() const {
  const auto bytes = [](std::size_t count, std::size_t each) {
    return PassCards::allocated_bytes(count * each);
  };
  return bytes(keys, sizeof(uint64_t)) + bytes(keys, sizeof(row_index_t)) +
         bytes(floats, sizeof(float)) + bytes(flags, 1) +
         bytes(1, sizeof(card_table::ErasePresentCheck)) +
         bytes(ChunkChain::kDepth, sizeof(uint32_t));
}

std::size_t NextPassScratchSizes::pinned_bytes() const {
  std::size_t bytes = 0;
  for_each_pinned(
      *this, [&](auto buffer, std::size_t entries) { bytes += entries * entry_bytes(buffer); });
  return bytes;
}

std::size_t NextPassScratch::pinned_bytes() const {
  std::size_t bytes = 0;
  for_each_pinned(NextPassScratchSizes{}, [&](auto buffer, std::size_t /*entries*/) {
    bytes += (this->*buffer).size() * entry_bytes(buffer);
  });
  return bytes;
}

std::size_t NextPassWork::kept_pinned_bytes() const {
  std::size_t most = 0;
  for (const NextPassScratch& kept : kept_) most = std::max(most, kept.pinned_bytes());
  return most;
}

void NextPassWork::lend_scratch(int c, NextPassCard& next) {
  device::Card& card = cards_.card(c);
  const NextPassScratchSizes sizes = next_pass_scratch_sizes(cards_.shape(), cards_.row_budget());
  const std::size_t depth = ChunkChain::kDepth;
  NextPassScratch& scratch = next.scratch;
  scratch = std::exchange(kept_[static_cast<std::size_t>(c)], NextPassScratch{});
  if (!scratch.made) {
    // The first pass that runs the work: every buffer made once, at its size (the options and
    // the budget do not change).
    device::CardMemory& memory = card.memory();
    const device::Stream& stream = card.stream();
    scratch.d_keys = device::device_buffer<uint64_t>(sizes.keys, memory, stream);
    scratch.d_rows = device::device_buffer<row_index_t>(sizes.keys, memory, stream);
    scratch.d_floats = device::device_buffer<float>(sizes.floats, memory, stream);
    scratch.d_flags = device::device_buffer<uint8_t>(sizes.flags, memory, stream);
    scratch.d_erase_check = device::device_buffer<card_table::ErasePresentCheck>(1, memory, stream);
    scratch.d_failed = device::device_buffer<uint32_t>(depth, memory, stream);
    // Sized, but empty until a chunk fits them (fit: within their capacity).
    scratch.d_keys.clear();
    scratch.d_rows.clear();
    scratch.d_floats.clear();
    scratch.d_flags.clear();
    for_each_pinned(sizes, [&](auto buffer, std::size_t entries) {
      scratch.*buffer = std::remove_reference_t<decltype(scratch.*buffer)>(entries);
    });
    const bool paced = ChunkPacer(sizes.chunk, cards_.options().next_pass_step_fraction).paced();
    const auto timing = paced ? device::EventTiming::kOn : device::EventTiming::kOff;
    for (std::size_t i = 0; i <= depth; ++i) {
      scratch.ends.emplace_back(card.device(), card.stream().counters(), timing);
      if (paced) scratch.begins.emplace_back(card.device(), card.stream().counters(), timing);
    }
    scratch.made = true;
  }
  // What a pass's work starts from.
  device::memset_bytes_async(scratch.d_erase_check.data(), 0, sizeof(card_table::ErasePresentCheck),
                             card.stream());
  for (std::size_t i = 0; i < depth; ++i) {
    scratch.h_erase_check[i] = card_table::ErasePresentCheck{};
    scratch.h_failed[i] = 0;
  }
  next.list_room = sizes.list_room;
  next.lists_started = 0;
  next.lists_read = 0;
  next.insert_room = sizes.insert_room;
  next.inserts_started = 0;
  next.inserts_read = 0;
  next.slot_keys = sizes.chunk;
  next.slot_offsets.assign(sizes.chunk * depth, 0);
  next.slot_count.assign(depth, 0);
  next.enqueued = 0;
  next.readbacks = 0;
  next.chain = ChunkChain(ChunkPacer(sizes.chunk, cards_.options().next_pass_step_fraction), depth);
}

void NextPassWork::keep_scratch(int c, NextPassCard& work) {
  if (!work.scratch.made) return;
  // What is in flight is on the card's stream, in order: once the newest chunk's end event has
  // passed (none left open, so it was recorded) or the stream is idle, every chunk and its
  // readbacks are done, and a work that expired (begin_pass did not read it) adds no wait.
  const bool pending = work.chain.in_flight() > 0 || work.readbacks > 0;
  const bool ended = work.chain.in_flight() > 0 && !work.chunk_open &&
                     work.scratch.ends[work.chain.newest().event].ready();
  if (pending && !ended && !cards_.card(c).stream().ready()) {
    wait_for_card(c, "its chunks in flight before its scratch is kept");
  }
  kept_[static_cast<std::size_t>(c)] = std::exchange(work.scratch, NextPassScratch{});
}

void NextPassWork::keep_idle_scratch() {
  for (std::size_t c = 0; c < cards_work_.size(); ++c) {
    NextPassCard& work = cards_work_[c];
    if (work.scratch.made && work.chain.in_flight() == 0 && work.readbacks == 0) {
      kept_[c] = std::exchange(work.scratch, NextPassScratch{});
    }
  }
}

void NextPassWork::collect(int c, NextPassCard& next) {
  ChunkChain& chain = next.chain;
  while (chain.in_flight() > 0) {
    const ChunkChain::Chunk chunk = chain.oldest();
    if (!next.scratch.ends[chunk.event].ready()) return;  // nor the ones after it (one stream)
    // previous end -> (the steps) -> begin -> (the chunk) -> end, all on the stream: all passed.
    std::optional<ChunkChain::Times> times;
    if (chain.pacer().paced() && chunk.steps_before > 0) {
      const device::Event& begin = next.scratch.begins[chunk.event];
      times =
          ChunkChain::Times{next.scratch.ends[chunk.event].seconds_since(begin),
                            begin.seconds_since(next.scratch.ends[chain.previous_event(chunk)])};
    }
    // A phase ends only once its chunks are all read: the chunks in flight are the phase's.
    switch (next.phase) {
      case NextPassCard::Phase::kLookup:
        read_lookup(c, next, chunk);
        break;
      case NextPassCard::Phase::kMark:
        read_marks(c, next, chunk);
        break;
      case NextPassCard::Phase::kList:
        read_list(next, chunk);
        break;
      case NextPassCard::Phase::kErase:
        read_erase(c, next, chunk);
        break;
      case NextPassCard::Phase::kInsert:
        read_insert(c, next, chunk);
        break;
      default:
        break;
    }
    chain.retire(times);
  }
}

std::optional<ChunkChain::Chunk> NextPassWork::begin_chunk(int c, NextPassCard& next,
                                                           std::size_t left) {
  std::optional<ChunkChain::Chunk> chunk = next.chain.start(left);
  if (!chunk) return chunk;
  next.chunk_open = true;
  next.table_size_at_open = cards_.store(c).size();
  next.injected_fault = chosen_for_fault(next.phase);
  fault_point(next, ChunkFault::kBegin);
  return chunk;
}

bool NextPassWork::chosen_for_fault(NextPassCard::Phase phase) {
  int64_t before = chunks_before_fault_.load(std::memory_order_acquire);
  if (before < 0 || phase != fault_phase_) return false;
  while (before > 0 && !chunks_before_fault_.compare_exchange_weak(before, before - 1)) {
  }
  // One chunk fails: the one that finds 0 and sets -1.
  return before == 0 && chunks_before_fault_.compare_exchange_strong(before, -1);
}

void NextPassWork::fault_point(NextPassCard& next, ChunkFault point) const {
  if (!next.injected_fault || point != fault_point_) return;
  next.injected_fault = false;
  GPUBOX_FAIL("the next pass's card work: fault injected (fail_chunk_after) ",
              point == ChunkFault::kBegin ? "as a chunk began" : "after a chunk's table call");
}

void NextPassWork::begin_work(int c, NextPassCard& next, const ChunkChain::Chunk& chunk) {
  if (next.chain.pacer().paced()) next.scratch.begins[chunk.event].record(cards_.card(c).stream());
}

void NextPassWork::end_chunk(int c, NextPassCard& next, const ChunkChain::Chunk& chunk,
                             std::size_t keys) {
  // A chunk that did no work (no key of this card in a mark window, nothing left to erase or
  // insert) measures nothing: its ~0 s would double the pacer's chunks.
  next.chain.set_newest_keys(keys);
  next.scratch.ends[chunk.event].record(cards_.card(c).stream());
  next.chunk_open = false;
}

bool NextPassWork::prepare(int c) {
  using Phase = NextPassCard::Phase;
  // Read before written: card threads share the flag's line once a pass, not once a step.
  if (!prepared_in_pass_.load(std::memory_order_relaxed)) {
    prepared_in_pass_.store(true, std::memory_order_relaxed);
  }
  if (static_cast<std::size_t>(c) >= cards_work_.size()) return false;
  NextPassCard& next = cards_work_[static_cast<std::size_t>(c)];
  if (next.phase == Phase::kOff || next.phase == Phase::kDone) return false;
  if (next.generation != generation_) {
    next.phase = Phase::kOff;
    return false;
  }
  // Every step is a poll, those that return early too (waiting for the staged rows, often many
  // steps): the chunk after them shares the card time since the chunk before among them all.
  next.chain.poll();
  if (next.phase == Phase::kWaiting && !start(c, next)) return false;
  if (next.phase == Phase::kInsert && !next.rows_ready) {
    // Looked up and room made; the inserts wait for the fetch (for ever when it failed: its
    // begin_pass then gets no staged rows and does the rest, exact as the rows evicted were
    // clean).
    if (!next.poll().rows_ready) return false;
    next.rows_ready = true;
    next.poll = nullptr;
  }
  device::Card& card = cards_.card(c);
  const device::DeviceCounts before = card.counts();
  Timer timer;
  // The step before returned without waiting for the card (issue 31), so its collectives may be
  // in flight. A look-up chunk waits for nothing: it allocates nothing (its scratch was sized by
  // expect()) and its rows are read by a later prepare(), once its end event has passed (up to
  // ChunkChain::kDepth chunks in flight: the host running steps ahead of the card does not stall
  // the look-ups). Mark, list, erase and insert chunks are the same (a find, a listing of every
  // slot with no count, an erase of victims known present, an insert of keys known missing into
  // a table sized for them: read back late, or nothing to read but a check). What waits is
  // counted as this work's waits (early_host_syncs), not the step's.
  try {
    collect(c, next);
    run_chunk(c, next);
  } catch (const std::exception& e) {
    // A damaged table (a victim was not there to erase: its free list holds an invalid row) is
    // not the work's alone: the job stops.
    if (next.damaged) throw;
    // The work is optional: what it did so far leaves the card exact (victims were clean,
    // inserted rows are the host tier's copies; the drain reads or undoes the chunks in
    // flight), so begin_pass does the whole job instead of the pass failing. A device fault
    // that persists fails the drain's wait.
    GPUBOX_LOG(WARNING) << "card " << card.rank() << ": the next pass's card work stopped ("
                        << e.what() << "); begin_pass of the next pass does it all";
    const Phase stopped_in = next.phase;
    next.phase = Phase::kOff;
    drain_after_fault(c, next, stopped_in);  // throws when the fault persists: the job stops
  }
  // Done or stopped, its scratch stays with the work until begin_pass keeps it for the next pass
  // (keep_scratch): freed here, a cudaFreeHost would wait for the device inside the step's
  // collectives (uncounted), and a card free would change the memory generation the step graphs
  // are captured for.
  next.counts += card.counts() - before;
  next.seconds += timer.seconds();
  ++next.chunks;
  return next.phase != Phase::kDone && next.phase != Phase::kOff;
}

bool NextPassWork::start(int c, NextPassCard& next) {
  // The keys are enough to start: look-ups and evictions need no staged row.
  const StagedRows* staged = next.poll().staged;
  if (staged == nullptr) return false;
  const std::size_t n =
      staged->owned.size() == cards_.num_cards() ? staged->owned[c].keys.size() : 0;
  // Several trainers staged nothing: begin_pass does it all. A pass over the budget fails
  // there with its numbers.
  if (staged->owned.size() != cards_.num_cards() ||
      (cards_.row_budget() > 0 && n > cards_.row_budget())) {
    next.phase = NextPassCard::Phase::kOff;
    return false;
  }
  next.staged = staged;
  next.at = 0;
  next.staged_at = c > 0 ? staged->card_end[c - 1] : 0;
  // The next pass's rows found on the card are marked as they are found, in case room must be
  // made (a byte per pool row; dropped at once if not).
  if (cards_.row_budget() > 0) next.marks.assign(cards_.store(c).pool(0).capacity(), 0);
  next.phase = NextPassCard::Phase::kLookup;
  return true;
}

void NextPassWork::run_chunk(int c, NextPassCard& next) {
  switch (next.phase) {  // chunks in flight, read by a later collect()
    case NextPassCard::Phase::kLookup:
      return lookup(c, next);
    case NextPassCard::Phase::kMark:
      return mark(c, next);
    case NextPassCard::Phase::kList:
      return list(c, next);
    case NextPassCard::Phase::kErase:
      return erase(c, next);
    case NextPassCard::Phase::kInsert:
      return insert(c, next);
    default:
      return;
  }
}

void NextPassWork::lookup(int c, NextPassCard& next) {
  card_table::CardSparseStore& store = cards_.store(c);
  const device::Stream& stream = cards_.card(c).stream();
  const OwnedKeys& mine = next.staged->owned[c];
  const std::size_t left = mine.keys.size() - next.enqueued;
  // None when the chain is full (the card is not there yet: a later poll reads the oldest).
  const std::optional<ChunkChain::Chunk> chunk = begin_chunk(c, next, left);
  if (!chunk) {
    if (left == 0 && next.chain.in_flight() == 0) plan(c, next);
    return;
  }
  const std::size_t n = chunk->keys;
  const std::size_t from = chunk->slot * next.slot_keys;  // its slot of the scratch
  fit(c, next.scratch.d_keys, from + n);                  // no allocation: expect() sized the slots
  fit(c, next.scratch.d_rows, from + n);
  uint64_t* d_keys = next.scratch.d_keys.data() + from;
  row_index_t* d_rows = next.scratch.d_rows.data() + from;
  std::copy_n(mine.keys.data() + next.enqueued, n, next.scratch.h_keys.data() + from);
  begin_work(c, next, *chunk);
  device::copy_async(d_keys, next.scratch.h_keys.data() + from, n, stream);
  // The table's find alone (lookup_or_create waits for it): kInvalidRow for a missing key.
  store.table().find(d_keys, n, d_rows, stream);
  fault_point(next, ChunkFault::kAfterTableCall);
  device::copy_async(next.scratch.h_rows.data() + from, d_rows, n, stream);
  ++next.readbacks;
  end_chunk(c, next, *chunk, n);
  next.enqueued += n;
}

void NextPassWork::read_lookup(int c, NextPassCard& next, const ChunkChain::Chunk& chunk) {
  const StagedRows& staged = *next.staged;
  const OwnedKeys& mine = staged.owned[c];
  const std::size_t first = c > 0 ? staged.card_end[c - 1] : 0;
  const std::size_t end = staged.card_end[c];
  const row_index_t* found = next.scratch.h_rows.data() + chunk.slot * next.slot_keys;
  --next.readbacks;
  // As begin_pass splits them: hits, missing keys staged (both lists sorted: one walk), the
  // rest.
  for (std::size_t i = 0; i < chunk.keys; ++i) {
    const std::size_t k = next.at + i;
    if (found[i] != card_table::kInvalidRow) {
      next.hit_rows.push_back(found[i]);
      if (found[i] < next.marks.size()) next.marks[found[i]] = 1;
      continue;
    }
    ++next.missing;
    while (next.staged_at < end && staged.keys[next.staged_at] < mine.keys[k]) ++next.staged_at;
    if (next.staged_at < end && staged.keys[next.staged_at] == mine.keys[k]) {
      next.used.push_back(static_cast<uint32_t>(next.staged_at - first));
    } else {
      next.to_pull.keys.push_back(mine.keys[k]);
      next.to_pull.slots.push_back(mine.slots[k]);
    }
  }
  next.at += chunk.keys;
}

void NextPassWork::plan(int c, NextPassCard& next) {
  next.at = 0;
  const std::size_t resident = cards_.store(c).size();
  if (cards_.row_budget() > 0 && resident + next.missing > cards_.row_budget()) {
    // Room to make: the rows of the next pass are marked (by row index: one pool, handles are
    // dense indices); the current pass's are marked next.
    next.phase = NextPassCard::Phase::kMark;
  } else {
    next.marks = {};
    next.phase = NextPassCard::Phase::kInsert;
  }
}

}  // namespace gpubox::pass
