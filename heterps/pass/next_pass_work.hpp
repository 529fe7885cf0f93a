// NextPassWork: the next pass's card work done between the current pass's steps
// (PassManager::expect_next_pass / prepare_next_pass; the contract, the memory it takes and why
// it is exact: pass_manager.hpp). Per card, a state machine a bounded chunk at a time:
//
//   kWaiting  until the next pass's keys are planned (StagingProgress::staged)
//   kLookup   its keys on this card looked up: hits, missing staged, missing to pull
//   kMark     (room to make) the current pass's rows marked beside the next pass's
//   kList     the table listed, the clean unmarked rows that leave first chosen as it goes
//             (the store's eviction policy: card_table::VictimHeap)
//   kErase    the victims erased
//   kInsert   once the rows are fetched, staged rows inserted into the room made
//   kDone     (kOff: not expected, ruled out, stale, or stopped by a fault)
//
// Chunks wait for nothing: their results come back late, several chunks in flight (ChunkChain),
// and what their table calls would read back is either known on the host (an erase of victims
// known present: their count; an insert of staged keys known missing: their count, each taking
// its candidate row) or read late (a look-up's rows, a listing's every slot, uncompacted; an
// erase's check that every victim was there at its listed row; an insert's rows and its check
// that every key took its candidate). An insert allocates nothing either: the table and the
// pool are sized ahead, at the pass boundary (expect()), for the staged keys when their plan is
// known then, else (the trainer plans the next pass during the pass) for the keys the current
// pass's begin_pass found missing on the card and an eighth: consecutive passes bring about as
// many new keys (the first pass: all of its keys). No chunk grows them (issue 31: no allocation
// between a pass's first and last step; a step's collectives may be in flight, device rule 1):
// where that sizing fell short (a plan larger than guessed), the inserts stop at the room there
// is and begin_pass inserts the rest. Under a card budget the table never grows: expect()
// reclaims the slots earlier evictions erased (a same-size rehash, when they would keep the
// inserts out), and the inserts stop at the table's load bound, the slots the work's own
// evictions erase counting against it until the next boundary. A key that could not take its
// row (a probe run past the bound: rare) is repaired when its chunk is read, after a wait.
//
// Every wait between steps is the bounded one (PassCards::wait_between_steps: the card tier's
// communicator's, as the step's own): a step's collectives may be pending on the stream, and a
// peer that never joins them fails the wait, naming the card and the pass, instead of hanging it.
// A fault that stops the work (kOff) leaves the card exact: the chunks in flight are read after
// such a wait (drain_after_fault), an insert that did not take its row repaired, and a chunk cut
// short by the fault undone (its end event was never recorded: nothing waits on it) without an
// allocation or a pageable copy.
//
// begin_pass takes what every card did (take) and uses it where it still holds: made for the
// staging it is given and no other change of the cards' keys since (generation).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "common/error.hpp"
#include "heterps/card_table/eviction_policy.hpp"
#include "heterps/card_table/sparse_types.hpp"
#include "heterps/device/card.hpp"
#include "heterps/device/memory.hpp"
#include "heterps/pass/chunk_pacer.hpp"
#include "heterps/pass/pass_cards.hpp"
#include "heterps/pass/pass_types.hpp"

namespace gpubox::pass {

// One card's scratch for the next pass's card work: card buffers for the chunks in flight, their
// pinned copies and the chunks' events. Sized for the largest chunk of every phase
// (next_pass_scratch_sizes) by the first expect() that runs the work, then kept from pass to
// pass (NextPassWork lends it to each pass's NextPassCard and takes it back once begin_pass used
// what the work did), so a later pass allocates no card or pinned memory for it, and a chunk
// allocates nothing (it needs no wait for the step's collectives before it: device rule 1).
// Its card bytes are a term of the card tier's plan (CardTierPlan::next_pass_bytes).
struct NextPassScratch {
  // Lookup, mark, list, erase and insert scratch on the card (regions by chunk slot or list /
  // insert region: NextPassCard says which phase uses which).
  device::device_buffer<uint64_t> d_keys;
  device::device_buffer<card_table::row_index_t> d_rows;
  device::device_buffer<float> d_floats;
  device::device_buffer<uint8_t> d_flags;
  device::device_buffer<card_table::ErasePresentCheck> d_erase_check;
  device::device_buffer<uint32_t> d_failed;
  // Pinned: a look-up's keys and rows by chunk slot, two list regions' keys, rows, ranks and
  // dirty flags, the erase check and failed inserts by chunk slot, two insert regions' records.
  // Made, counted by the plan and read back through one list (next_pass_work.cpp's
  // for_each_pinned): a buffer added here goes there.
  device::pinned_buffer<uint64_t> h_keys;
  device::pinned_buffer<card_table::row_index_t> h_rows;
  device::pinned_buffer<uint64_t> h_list_keys;
  device::pinned_buffer<card_table::row_index_t> h_list_rows;
  device::pinned_buffer<float> h_list_ranks;
  device::pinned_buffer<uint8_t> h_list_dirty;
  device::pinned_buffer<card_table::ErasePresentCheck> h_erase_check;
  device::pinned_buffer<uint32_t> h_failed;
  device::pinned_buffer<float> h_records;
  // Each chunk's end event (timed when paced) and, when paced, its begin event: depth + 1 of
  // each.
  std::vector<device::Event> begins, ends;
  bool made = false;  // given the card's memory (NextPassWork::lend_scratch)
  // The bytes of the pinned buffers (0 until made).
  std::size_t pinned_bytes() const;
};

// The sizes of NextPassScratch's buffers on one card (entries of each), for `chunk` keys a chunk.
struct NextPassScratchSizes {
  std::size_t chunk = 0;        // keys a chunk at most (PassOptions::next_pass_chunk_keys, capped)
  std::size_t keys = 0;         // d_keys, d_rows
  std::size_t floats = 0;       // d_floats
  std::size_t flags = 0;        // d_flags
  std::size_t list_room = 0;    // entries of a list region (two: h_list_*)
  std::size_t insert_room = 0;  // records of an insert region (two: h_records)
  std::size_t records = 0;      // floats of h_records: two insert regions of rows
  // Card bytes of them all (each allocation at PassCards::allocated_bytes).
  std::size_t card_bytes() const;
  // Pinned host bytes of them all (NextPassScratch's h_*), held as long as the card bytes.
  std::size_t pinned_bytes() const;
};

// Whether the next pass's card work can run on these cards at all: next_pass_chunk_keys > 0,
// sharded placement, one pool (no width classes: compact_pool moves rows), one trainer (nothing
// is staged for several).
bool next_pass_work_possible(const CardTierShape& shape);
// The same without a store: `pools` the stores' row pools (table::width_classes' count).
bool next_pass_work_possible(const PassManagerOptions& options, int32_t pools, int local_cards,
                             int total_cards);
// Under a budget a chunk is at most a 1/kBudgetRowsPerChunkKey of its rows.
inline constexpr std::size_t kBudgetRowsPerChunkKey = 64;
// The sizes of the scratch on each card for a row budget of `rows` (0: none). The chunk is
// next_pass_chunk_keys, but under a budget at most a sixty-fourth of its rows (at least
// ChunkPacer::kMinKeys keys, or the rows if fewer), with insert regions of half a chunk: the
// scratch, about 280 card bytes a chunk key at rows of 18 floats (its list regions take 8 table
// slots a key, 17 bytes each, two at once), then costs a budget about 4.5 bytes a row (a small
// budget about 70 KiB at least), not the 40 MiB of a default chunk of 131072 keys.
NextPassScratchSizes next_pass_scratch_sizes(const CardTierShape& shape, std::size_t rows);

// What the next pass's card work did and knows on one card, for the next begin_pass.
struct NextPassCard {
  enum class Phase { kOff, kWaiting, kLookup, kMark, kList, kErase, kInsert, kDone };
  Phase phase = Phase::kOff;
  std::function<StagingProgress()> poll;  // until the rows are ready
  const StagedRows* staged = nullptr;
  bool rows_ready = false;  // staged->rows fetched: kInsert may run
  std::shared_ptr<const std::vector<uint64_t>> current_keys;  // the training pass's, sorted
  uint64_t generation = 0;                                    // NextPassWork's when expected
  std::size_t at = 0;                                         // progress within the phase
  std::size_t staged_at = 0;  // kLookup: the walk through this card's staged keys
  // After kLookup, the next pass's keys on this card: the rows of those there (hits, then the
  // ones inserted early, as their chunks are read: NextPassWork::finish reads the last ones),
  // the missing ones staged (offsets in this card's range of staged->keys, the first `inserted`
  // of them inserted early, counted when enqueued), the missing ones not staged (begin_pass
  // pulls them).
  std::vector<card_table::row_index_t> hit_rows;
  std::vector<uint32_t> used;
  OwnedKeys to_pull;
  std::size_t missing = 0;
  std::size_t inserted = 0;
  // kMark / kList: the current and next pass's rows (a byte per pool row). kList / kErase: the
  // victims, chosen as the listing goes among the rows to evict for the next pass to fit.
  std::vector<uint8_t> marks;
  card_table::VictimHeap victims;
  // kMark: the current pass's rows the next pass lacks (offsets in current_keys, and rows).
  // Once every row outside both passes is evicted (`outside_gone`), they are the only ones
  // begin_pass may evict.
  std::vector<uint32_t> spare_at;
  std::vector<card_table::row_index_t> spare_rows;
  bool evicts_all_outside = false;  // kList chose every row outside both passes
  bool outside_gone = false;        // ... and kErase removed them
  uint64_t evicted = 0;
  uint64_t chunks = 0;
  device::DeviceCounts counts;  // of the chunks
  double seconds = 0;
  // kLookup without a host wait: a chunk's keys go up from its slot of h_keys and its rows come
  // back into the same slot of h_rows (scratch: ChunkChain::depth slots of slot_keys each), its
  // end event recorded after; a later prepare() reads the chunks in flight oldest first, each
  // once its end event has passed (Event::ready, a poll).
  std::size_t slot_keys = 0;  // the largest chunk
  std::size_t enqueued = 0;   // kLookup: keys enqueued so far (those from `at` on are in flight)
  std::size_t readbacks = 0;  // chunks in flight whose rows come back into h_rows
  // kMark, the same way: a chunk's keys (its window's of this card) and their offsets in
  // current_keys, by slot, and how many each slot holds (kList: the entries it listed).
  std::vector<uint32_t> slot_offsets;
  std::vector<std::size_t> slot_count;
  // kList: a chunk lists up to 8 table slots a key of its size, every slot (no compaction, so no
  // count to read back), into one of two regions of list_room entries (card scratch at
  // region * list_room of d_keys, d_rows, d_floats (ranks) and d_flags (dirty), and their pinned
  // copies h_list_*): at most two list chunks in flight, read oldest first.
  std::size_t list_room = 0;
  std::size_t lists_started = 0;
  std::size_t lists_read = 0;
  // kErase: victims not found on the card, or found at another row than listed (the table
  // changed under the work), counted on the card across chunks (d_erase_check, zeroed when the
  // work is expected), and its copy per chunk slot (h_erase_check), read late: nonzero stops the
  // job (`damaged`: the free list then holds an invalid row, or rows the work did not plan).
  bool damaged = false;
  // kInsert: a chunk's keys in its slot of h_keys / d_keys, its rows back into its slot of
  // d_rows / h_rows, its staged records in one of two regions of insert_room records (h_records,
  // pinned; d_floats at region * insert_room * stride): at most two insert chunks in flight, read
  // oldest first. d_failed / h_failed: per chunk slot, its keys that did not take their row.
  std::size_t insert_room = 0;
  std::size_t inserts_started = 0;
  std::size_t inserts_read = 0;
  // The chunks in flight and their sizes (ChunkChain, ChunkPacer); each chunk's end event
  // (timed when paced) and, when paced, its begin event (scratch.ends, scratch.begins).
  ChunkChain chain;
  // The card and pinned buffers the chunks use, lent by NextPassWork for the pass (kept from
  // pass to pass: NextPassScratch).
  NextPassScratch scratch;
  // The newest chunk is being enqueued (begin_chunk .. end_chunk): a fault now cuts it short,
  // its end event not recorded. table_size_at_open: the store's size() when it began (an insert
  // or erase that reached its table call changed it).
  bool chunk_open = false;
  std::size_t table_size_at_open = 0;
  bool injected_fault = false;  // NextPassWork::fail_chunk_after chose this chunk

  // Whether begin_pass can use this work: its keys looked up for `for_staged`, with no other
  // change of the cards' keys since (`current_generation`).
  bool usable_for(const StagedRows* for_staged, uint64_t current_generation) const {
    const bool looked_up =
        phase != Phase::kOff && phase != Phase::kWaiting && phase != Phase::kLookup;
    return staged == for_staged && generation == current_generation && looked_up;
  }
};

class NextPassWork {
 public:
  // Where fail_chunk_after's fault strikes a chunk: as it begins (nothing enqueued yet), or
  // right after its table call (a look-up's find, an erase, an insert), before its readbacks.
  enum class ChunkFault { kBegin, kAfterTableCall };

  explicit NextPassWork(const PassCards& cards)
      : cards_(cards), pass_missing_(cards.num_cards(), 0), kept_(cards.num_cards()) {}

  // PassManager::expect_next_pass; `training`: a training pass is on (between its begin_pass
  // and end_pass), the only pass the work may run beside; `pass_id` names it in errors.
  void expect(std::shared_ptr<const std::vector<uint64_t>> current_keys,
              const std::function<StagingProgress()>& poll, bool training, int64_t pass_id);
  // PassManager::prepare_next_pass: one chunk on card `c` (its thread); false when none now.
  bool prepare(int c);
  // The cards' key set changed other than by this work (begin_pass, an evaluation's end_pass,
  // clear): what a card remembered is stale from now on.
  void keys_changed() { ++generation_; }
  // Forgets the work (the cards were emptied).
  void forget() {
    keys_changed();
    keep_idle_scratch();
    cards_work_.clear();
    prepared_in_pass_.store(false, std::memory_order_relaxed);
  }
  // Whose generation a card's work must carry to be usable now (NextPassCard::usable_for).
  uint64_t generation() const { return generation_; }
  // begin_pass: what every card did (used or not, its evictions and chunks happened), taken
  // away; the cards' keys change from now on (keys_changed).
  std::vector<NextPassCard> take();
  // begin_pass, on card c's thread, for what take() returned: the erases and inserts still in
  // flight when the pass ended are read now (their late reads never came: the inserted keys'
  // rows join hit_rows, a key that did not take its row is repaired), and every erase is checked
  // (check_erases). Waits for the card's stream when chunks were in flight or the work erased.
  void finish(int c, NextPassCard& work);
  // begin_pass, on card c's thread, once it is done with `work` (taken and finished): its
  // scratch is kept for the next expect(), after a wait for the card when chunks are still in
  // flight (a look-up, mark or list chunk: finish reads only erases and inserts), so that none
  // writes into the scratch once it is lent again.
  void keep_scratch(int c, NextPassCard& work);
  // Card c's thread, before anything lists its table (end_pass's and sync's write-back): the
  // erases and inserts still in flight are read now (after a wait when any), so that a victim
  // changed under the work stops the job naming it, not a listing's count that disagrees.
  void settle(int c);
  // A victim that was not on the card, or not at the row it was listed with, stops the job here
  // (naming the key and the card), before the next pass takes rows from a damaged free list.
  // Waits for the card's stream when the work erased anything.
  void check_erases(int c, const NextPassCard& work) const;
  // begin_pass of a training pass, on card c's thread: about `missing` new keys are expected on
  // card c in the next pass, the next expect()'s guess of its inserts there when their plan is
  // not known (pass_boundary.cpp says how it is counted).
  void note_pass_missing(int c, std::size_t missing) {
    pass_missing_[static_cast<std::size_t>(c)] = missing;
  }
  // Fault injection for tests (as table::SparseTable::fail_pulls_after): once `ok_chunks` more
  // chunks of `phase` have begun (every card's together), the next one throws gpubox::Error at
  // `point`, as a device fault would there, and the ones after run; ok_chunks -1: never (the
  // default). Set from the controlling thread before the steps; one atomic load a chunk.
  void fail_chunk_after(int64_t ok_chunks, NextPassCard::Phase phase, ChunkFault point) {
    fault_phase_ = phase;
    fault_point_ = point;
    chunks_before_fault_.store(ok_chunks, std::memory_order_release);
  }
  // The pinned host bytes of the scratch kept between passes (NextPassScratch's h_*), on the
  // card that holds most: at most CardTierPlan::next_pass_pinned_bytes. Between passes.
  std::size_t kept_pinned_bytes() const;
  // Card c's phase (kOff when none is expected): for tests and logs.
  NextPassCard::Phase phase(int c) const {
    return static_cast<std::size_t>(c) < cards_work_.size()
               ? cards_work_[static_cast<std::size_t>(c)].phase
               : NextPassCard::Phase::kOff;
  }

 private:
  // kWaiting: starts the look-ups once the keys are planned. False while they are not (or the
  // work is ruled out: kOff).
  bool start(int c, NextPassCard& next);
  // The current phase's chunk.
  void run_chunk(int c, NextPassCard& next);
  void lookup(int c, NextPassCard& next);
  // kLookup's host half: the rows of `chunk` (the oldest in flight, whose end has passed).
  void read_lookup(int c, NextPassCard& next, const ChunkChain::Chunk& chunk);
  // Lends card `c`'s kept scratch to `next` (made on first use, for the largest chunk of each
  // phase: expect(), between passes, no collective in flight) and readies it for a pass.
  void lend_scratch(int c, NextPassCard& next);
  // The controlling thread, between passes: the scratch of cards_work_ with no chunk in flight
  // kept (the rest is freed with it: nothing waits here).
  void keep_idle_scratch();
  // Retires the chunks in flight whose end event has passed, oldest first: a look-up's rows
  // read, and (paced) its card time and the steps' before it to the pacer. A poll, no wait.
  void collect(int c, NextPassCard& next);
  // A chunk of at most `left` keys started; none when the chain is full. begin_work records its
  // begin event (when paced) right before its first card work, after the chunk's host work, so
  // that its card time is the card's alone; end_chunk records its end event after its card work,
  // and the work it did (`keys`, in the pacer's unit; 0: nothing measured).
  std::optional<ChunkChain::Chunk> begin_chunk(int c, NextPassCard& next, std::size_t left);
  void begin_work(int c, NextPassCard& next, const ChunkChain::Chunk& chunk);
  void end_chunk(int c, NextPassCard& next, const ChunkChain::Chunk& chunk, std::size_t keys);
  // A size of at least `count` within the capacity lend_scratch gave `buffer` (a buffer
  // holding several chunks' regions keeps the others' contents). Never an allocation between
  // steps: a count past the capacity (a sizing missed) throws, stopping the work (kOff).
  template <class T>
  void fit(int c, device::device_buffer<T>& buffer, std::size_t count);
  // After the last look-up: whether room must be made first (kMark) or not (kInsert).
  void plan(int c, NextPassCard& next);
  void mark(int c, NextPassCard& next);
  void list(int c, NextPassCard& next);
  void erase(int c, NextPassCard& next);
  // kMark's host half: the rows of `chunk` (the oldest in flight, whose end has passed) marked.
  void read_marks(int c, NextPassCard& next, const ChunkChain::Chunk& chunk);
  // kList's host half: the unmarked clean rows among `chunk`'s live entries offered as victims.
  void read_list(NextPassCard& next, const ChunkChain::Chunk& chunk);
  // kErase's host half: every victim of the chunks so far was on the card at its listed row, or
  // the job stops.
  void read_erase(int c, NextPassCard& next, const ChunkChain::Chunk& chunk);
  // Stops the job: `check` says which victim was not where the listing put it.
  [[noreturn]] void fail_erase(int c, const card_table::ErasePresentCheck& check) const;
  void insert(int c, NextPassCard& next);
  // kInsert's host half: the rows of `chunk` (the oldest in flight, whose end has passed) join
  // hit_rows, after a repair when some key did not take its row.
  void read_insert(int c, NextPassCard& next, const ChunkChain::Chunk& chunk);
  // The erase or insert chunks in flight on card c read, after a wait (finish, settle).
  void read_in_flight(int c, NextPassCard& work);
  // A fault stopped card c's work in `phase` (prepare's catch): after a wait for the stream (not
  // for end events: a chunk cut short never recorded its own), the chunks in flight are read
  // (an insert's keys that did not take their row repaired, an erase checked) and the one cut
  // short, if any, undone (undo_cut_insert) or checked. Throws, stopping the job, when the fault
  // persists (the wait fails) or an erase damaged the table.
  void drain_after_fault(int c, NextPassCard& work, NextPassCard::Phase phase);
  // The insert chunk `chunk` was cut short by a fault after its table call (the store counted
  // its keys; its records may never have been written): its keys that took their row leave
  // again and the rows of the others go back to the free list, so the card is as before it
  // (begin_pass inserts them). Waits twice (wait_for_card; a fault path), allocates nothing and
  // copies no pageable memory: the chunk's scratch slot and the free one after it carry it.
  void undo_cut_insert(int c, NextPassCard& work, const ChunkChain::Chunk& chunk);
  // Waits for card c's stream between steps: the bounded wait (PassCards::wait_between_steps).
  // Its failure stops the job naming the card, the pass and `what` the wait was for.
  void wait_for_card(int c, const char* what) const;
  // fail_chunk_after: whether the chunk of `phase` beginning now is the one to fail (counts it).
  bool chosen_for_fault(NextPassCard::Phase phase);
  // Throws the injected fault when `next`'s open chunk was chosen for one at `point`.
  void fault_point(NextPassCard& next, ChunkFault point) const;
  // A key of `chunk` did not take its row: the others kept, those inserted again after a wait.
  // `region`: the chunk's records in h_records.
  void repair_insert(int c, NextPassCard& next, const ChunkChain::Chunk& chunk, std::size_t region);
  // Sizes card c's table and pool for `keys` more keys (between passes: device rule 1).
  void reserve_inserts(int c, std::size_t keys);
  // Staged rows kInsert's next chunk inserts: within the chunk, the budget's room left and the
  // room the table and the pool have now (0: done; begin_pass inserts the rest).
  std::size_t insert_count(int c, const NextPassCard& next) const;
  // Staged rows this card may still insert (within the budget's room), all chunks together.
  std::size_t inserts_left(int c, const NextPassCard& next) const;

  const PassCards& cards_;
  // Changes whenever the cards' key set changes other than by this work.
  uint64_t generation_ = 0;
  // Per card, the keys the current training pass's begin_pass found missing on it (written by
  // card c's thread, read by expect() on the controlling thread after begin_pass returned):
  // expect() sizes the table and pool for that many inserts and an eighth when the next pass is
  // not planned yet. Mid-pass, between steps, no point allows the growth without a wait (the
  // steady step waits for nothing, so a step's collectives are in flight whenever the work runs:
  // device rule 1); the pass boundary does.
  std::vector<std::size_t> pass_missing_;
  std::vector<NextPassCard> cards_work_;
  // Per card, the scratch between passes (lent to cards_work_ while a pass's work runs).
  std::vector<NextPassScratch> kept_;
  int64_t pass_id_ = -1;  // the training pass the work runs beside (expect), for errors
  // prepare() ran since the last begin_pass (take) or forget(): a step of the pass has run
  // (the trainer calls prepare_next_pass after each), so expect() is too late.
  std::atomic<bool> prepared_in_pass_{false};
  // fail_chunk_after's: chunks of fault_phase_ to begin before the one that fails (-1: none).
  std::atomic<int64_t> chunks_before_fault_{-1};
  NextPassCard::Phase fault_phase_ = NextPassCard::Phase::kOff;
  ChunkFault fault_point_ = ChunkFault::kBegin;
};

template <class T>
void NextPassWork::fit(int c, device::device_buffer<T>& buffer, std::size_t count) {
  GPUBOX_EXPECTS(count <= buffer.capacity(), "card ", cards_.card(c).rank(),
                 ": the next pass's card work needs ", count, " entries of scratch, sized for ",
                 buffer.capacity(), " when it was expected");
  if (buffer.size() < count) buffer.resize_discard(count);  // within capacity: contents kept
}

}  // namespace gpubox::pass
