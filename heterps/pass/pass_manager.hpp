// PassManager: moves sparse rows between the host tier and the cards at pass boundaries, with
// the card tier kept as a cache across passes. It is the pass half of ps::CardTier (the card
// tier's owner, Paddle's PSGPUWrapper role: heterps/ps/card_tier.hpp), which builds it over its
// stores; schedules talk to the CardTier.
//
//   begin_pass(keys)  keys already on their owner card stay; only the missing ones are pulled
//                     from the host tier (in batches, several in flight) and inserted on their
//                     owner. If a card's budget would be exceeded, rows not needed by this pass
//                     are evicted first, lowest score first (they are clean: the previous
//                     end_pass wrote every change back). If the pass itself does not fit, it
//                     fails before anything is pulled, with the numbers and the remedy.
//   stage_rows(keys, exclude)  (any thread, also while the cards train) splits a coming pass's
//                     keys by owner card and pulls their host-tier rows, less `exclude`: the
//                     keys of every pass that trains between now and that pass's begin_pass.
//                     Those are the only rows whose host-tier value can change in between (a
//                     pass writes back only its own keys, at its end_pass), so each staged row
//                     is exactly what begin_pass would pull; begin_pass(keys, slots, &staged)
//                     inserts the staged rows of the keys missing on their card and pulls only
//                     the rest. A key excluded,
//                     or evicted after staging, is simply pulled. Call it after the end_pass
//                     of the pass before the first excluded one. Rows new to the host tier are
//                     created there by the fetch, from the same seeded rules a later pull
//                     would use, so only their creation moves earlier (a save in between
//                     holds them untrained).
//   Replicated placement (PassManagerOptions::placement, Collective mode): every card holds
//                     every key (no eviction; a table over the budget fails with its size); each
//                     row is pulled (or staged) once, by the first card, whose copy the others
//                     insert; end_pass writes back the first card's replica only.
//   end_pass(keep)    rows changed during the pass (dirty) are pushed to the host tier, then
//                     marked clean. After it, the host tier holds exactly what the cards hold,
//                     but for the rows of `keep` (the next training pass's keys, optional): they
//                     stay dirty on the cards until a later end_pass or sync() writes them.
//                     If the host tier fails midway, the rows stay dirty on the cards, so a
//                     retried end_pass() (or sync()) completes the write-back; rows the host
//                     already acknowledged are simply written again (a full-row overwrite).
//
// Card memory: with a budget, every store is sized once for the budget's rows (hash slots, free
// list, dirty flags), rows arrive page by page, eviction reads only keys and scores (victims'
// rows go to the free list and the next pull reuses them), and write-back streams dirty rows a
// page at a time, so CardMemory's peak stays under plan().total_bytes() (tested).
//
//   prepare_next_pass(c)  (card thread c, between the steps of the current training pass)
//                     once the next pass's keys are planned for its staging (expect_next_pass:
//                     the keys are known once the pass is read, long before its rows are
//                     fetched), does its card work a bounded chunk at a time: looks up its keys,
//                     evicts clean rows that neither the current pass nor the next one uses,
//                     and, once the staged rows are fetched, inserts them into the room made; it
//                     remembers it, so that its begin_pass only does what is
//                     left (rows of the current pass evicted when room is still short, the rest
//                     inserted, the keys staging left out pulled). Every table call of card c is
//                     made by card c's thread on its stream, so a chunk runs between two steps,
//                     never beside one; the current pass's rows never move or leave (they are
//                     marked by row index; no insert of the current pass happens, and nothing is
//                     erased but the unmarked rows). Rows outside the current pass are clean:
//                     the previous end_pass wrote back every dirty row but its `keep`, which are
//                     this pass's keys (the steps only dirty this pass's rows). Any other change
//                     of the cards' keys before that begin_pass (an evaluation pass, clear())
//                     makes begin_pass discard what was remembered and do the whole work, which
//                     is exact in any state: the early rows are clean copies of the host tier's.
//                     Off with Replicated placement and with width classes (compact_pool moves
//                     rows); with several trainers no rows are staged, so there is nothing to do.
//                     Memory while it runs: on the card, scratch for a chunk (its keys and rows,
//                     12 bytes each, 16 while listing 8 slots a key, a page of staged rows while
//                     inserting) beside the steps' own buffers, which plan() never counted (the
//                     boundary's working set it counts is larger and not live then); on the host,
//                     per next-pass key on the card its row index (4 bytes) and per staged key
//                     its offset (4), per current-pass row the next lacks its row and key
//                     offset (8), a byte per pool row, and (score, key) of the rows outside both
//                     passes (16 bytes), at most as many as must leave, until they are erased.
//                     The current pass's keys are shared with its data set, not copied.
//
// One trainer process: total cards == this process's cards (multi-trainer key exchange is not
// part of the pass manager yet). Calls are made from the controlling thread, between passes,
// never while card threads run steps. Stores and host tier are borrowed and must outlive it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "heterps/device/card.hpp"
#include "heterps/device/memory.hpp"
#include "heterps/pass/pass_types.hpp"
#include "heterps/sparse/sparse_types.hpp"
#include "table/host_tier.hpp"

namespace gpubox {
namespace sparse {
class CardSparseStore;
}

namespace pass {

class PassManager {
 public:
  // stores[i] belongs to cards.card(i).
  PassManager(device::CardSet& cards, std::vector<sparse::CardSparseStore*> stores,
              table::HostTier& host, const PassManagerOptions& options = {});

  // `keys`: the pass's unique keys (duplicates and key 0 are tolerated and dropped; a repeated
  // key keeps its first slot); `slots` (same length, or empty: slot 0) names each key's slot
  // for rows the host tier creates. `access`: a training pass, or an evaluation pass that leaves
  // the model unchanged (PassAccess; it takes no staged rows). Throws gpubox::Error when the
  // host tier fails (after its own retries) or the pass cannot fit.
  // `staged` (optional, borrowed for the call): what stage_rows made ready for this pass, from
  // the same `keys` and `slots` (its split by owner card is used as it is).
  PassStats begin_pass(const std::vector<uint64_t>& keys, const std::vector<int32_t>& slots = {},
                       const StagedRows* staged = nullptr, PassAccess access = PassAccess::kTrain);
  // The host-tier rows of `keys` (slots as for begin_pass) that are not in `exclude` (sorted):
  // plan_staging then fetch_staged. Touches only the host tier: safe while card threads run
  // steps and during end_pass, but not beside another call that changes the host tier's rows of
  // these keys (a load). Throws gpubox::Error when the host tier fails.
  StagedRows stage_rows(const std::vector<uint64_t>& keys, const std::vector<int32_t>& slots,
                        const std::vector<uint64_t>& exclude) const;
  // The first half of stage_rows: `keys` split by owner card and those to stage (not in
  // `exclude`), no rows yet (`fetched` false). Touches nothing shared.
  StagedRows plan_staging(const std::vector<uint64_t>& keys, const std::vector<int32_t>& slots,
                          const std::vector<uint64_t>& exclude) const;
  // The second half: pulls the rows of staged->keys into staged->rows and sets `fetched`.
  // Writes only rows, created, seconds and fetched, so card threads may read the keys meanwhile
  // (StagingProgress). Throws gpubox::Error when the host tier fails (`fetched` stays false).
  void fetch_staged(StagedRows* staged) const;
  // Every key on this process's cards (Replicated: card 0's, the others hold the same), in no
  // particular order; 8 bytes a key of host memory. Between passes, or after begin_pass before
  // the steps start (the cards idle). A coming pass's staging excludes them: a key of that pass
  // on its card now is still there at its begin_pass (eviction spares the pass's own keys), so
  // its staged row would never be used.
  std::vector<uint64_t> resident_keys() const;
  // Writes dirty rows back (after an evaluation pass: first takes the rows it borrowed off the
  // cards); returns this pass's counters (begin and end). `keep` (sorted, optional): the keys of
  // the next pass when it is a training pass that begins right after (the trainer's next pass
  // in the same epoch). Their rows stay on the cards, dirty, instead of being written back: that
  // pass trains them again and a later end_pass writes the newer value, so a row trained in
  // consecutive passes is pushed once. Until then the host tier holds an older value of them:
  // sync() (every save makes one) writes them back, eviction spares them, and a staging skips
  // them (they are on the cards). Ignored for an evaluation pass and with kReplicated.
  PassStats end_pass(const std::vector<uint64_t>& keep = {});
  // Writes dirty rows back without ending the pass (before a save). Returns rows written.
  uint64_t sync();

  // Controlling thread, after begin_pass and before the steps: the next pass will be a training
  // pass taking the rows that `poll` reports (StagingProgress: its keys once planned, then its
  // rows once fetched; the same object must then be given to its begin_pass, and stays valid
  // until then). Card threads call `poll` (a copy each). `current_keys`: this pass's unique keys,
  // sorted (key 0 allowed; shared with its data set, not copied: each card reads those it owns).
  // Does nothing when next_pass_chunk_keys is 0 or the placement or widths rule it out.
  void expect_next_pass(std::shared_ptr<const std::vector<uint64_t>> current_keys,
                        const std::function<StagingProgress()>& poll);
  // Card thread `c`, between two steps of the current pass: one chunk of the next pass's card
  // work (above). Returns false when there is none now: not expected, its keys not planned yet,
  // waiting for its rows (looked up and room made), or done.
  bool prepare_next_pass(int c);
  // Forgets the next pass's work (the cards were emptied: CardTier::clear).
  void forget_next_pass();

  // Rows per card the budget allows (0 = unlimited).
  std::size_t row_budget() const { return row_budget_; }
  // The card tier's footprint per card at the row budget (with no budget: for one key), for the
  // log line at the start of training.
  const CardTierPlan& plan() const { return plan_; }
  // The footprint of `rows` rows per card with these stores (monotone in rows).
  CardTierPlan plan_for(std::size_t rows) const;
  const PassStats& current() const { return current_; }
  bool in_pass() const { return in_pass_; }

 private:
  // The pass's keys by owner card, sorted, without key 0 and duplicates (a repeated key keeps
  // its first slot).
  std::vector<OwnedKeys> partition_by_owner(const std::vector<uint64_t>& keys,
                                            const std::vector<int32_t>& slots) const;
  // Those of card `c`'s keys that are not on the card; `hit_rows` receives the row indices of
  // the others.
  OwnedKeys missing_on_card(int c, const OwnedKeys& mine,
                            std::vector<sparse::row_index_t>* hit_rows);
  // Pulls `missing` from the host tier (created there with their slots when new; read with
  // HostTier::peek in an evaluation pass) into card `c`'s store. Returns how many rows the host
  // tier created (kEvaluate: how many keys it does not hold). `keep` (optional) receives the
  // pulled rows (packed in the order of missing.keys), for the replicas that share them.
  std::size_t pull_to_card(int c, const OwnedKeys& missing, std::vector<float>* keep = nullptr);
  // Inserts `n` rows (host memory, packed in the order of `keys`) into card `c`'s store, staged
  // on the card at most a page of rows at a time.
  void insert_to_card(int c, const uint64_t* keys, const float* rows, std::size_t n);
  bool replicated() const { return options_.placement == heter_comm::Placement::kReplicated; }
  // Replicated placement: the table (`rows` rows per card) does not fit the budget. Throws.
  [[noreturn]] void fail_table_over_budget(std::size_t rows) const;
  // Pushes every dirty row of card `c` but those of `keep` (sorted) to the host tier, then clears
  // their dirty flags; *kept = the dirty rows of `keep` left as they are. Adds the time spent
  // gathering rows off the card to *gather_seconds.
  uint64_t write_back(int c, double* gather_seconds, const std::vector<uint64_t>& keep,
                      uint64_t* kept);
  // write_back on every card; sets kept_dirty_. Returns the rows written.
  uint64_t write_back_all(const std::vector<uint64_t>& keep);
  // Removes `excess` rows of card `c` whose row index is not in `pass_rows` (the rows of the
  // pass's keys on the card), lowest score first, reading only keys, row indices and scores
  // (never a copy of the rows). Returns the rows removed.
  uint64_t evict(int c, const std::vector<sparse::row_index_t>& pass_rows, std::size_t excess);
  // evict() when the only rows of card `c` outside the pass are known: keys[at[i]] with row
  // indices rows[i] (the previous pass's rows this pass lacks, once prepare_next_pass removed
  // every row outside both). Reads only their scores. Returns the rows removed.
  uint64_t evict_among(int c, const std::vector<uint64_t>& keys, const std::vector<uint32_t>& at,
                       const std::vector<sparse::row_index_t>& rows, std::size_t excess);
  // An eviction candidate: a row's score and key (the lowest (score, key) leave first).
  struct Candidate {
    float score;
    uint64_t key;
  };
  // Removes the `excess` candidates with the lowest (score, key) from card `c` (they must be
  // clean). Returns the rows removed.
  uint64_t evict_lowest(int c, std::vector<Candidate>& candidates, std::size_t excess);
  // Width classes (a pool each): when the `missing` rows would grow the pools' pages past the
  // plan (a pool keeps its pages when its rows leave, so a shift in the mix of widths would hold
  // both), gives every pool's free pages back (CardSparseStore::compact_pool) first. Returns the
  // pages freed.
  std::size_t fit_pools(int c, const OwnedKeys& missing);
  // Removes `keys` from card `c`'s store, a page of keys at a time. Returns the rows removed.
  uint64_t erase_from_card(int c, const std::vector<uint64_t>& keys);

  // What prepare_next_pass did and knows on one card, for the next begin_pass.
  struct NextPassCard {
    enum class Phase { kOff, kWaiting, kLookup, kMark, kList, kErase, kInsert, kDone };
    Phase phase = Phase::kOff;
    std::function<StagingProgress()> poll;  // until the rows are ready
    const StagedRows* staged = nullptr;
    bool rows_ready = false;  // staged->rows fetched: kInsert may run
    std::shared_ptr<const std::vector<uint64_t>> current_keys;  // the training pass's, sorted
    uint64_t generation = 0;                                    // key_generation_ when expected
    std::size_t at = 0;                                         // progress within the phase
    std::size_t staged_at = 0;  // kLookup: the walk through this card's staged keys
    // After kLookup, the next pass's keys on this card: the rows of those there (hits, then the
    // ones inserted early), the missing ones staged (offsets in this card's range of
    // staged->keys, the first `inserted` of them inserted early), the missing ones not staged
    // (begin_pass pulls them).
    std::vector<sparse::row_index_t> hit_rows;
    std::vector<uint32_t> used;
    OwnedKeys to_pull;
    std::size_t missing = 0;
    std::size_t inserted = 0;
    // kMark / kList / kErase: the current and next pass's rows (a byte per pool row), and the
    // eviction candidates (score, key): while listing, a max-heap of the `lacking` lowest seen
    // so far (never more), then the victims erased from it.
    std::vector<uint8_t> marks;
    std::vector<std::pair<float, uint64_t>> candidates;
    std::size_t lacking = 0;   // kList: rows to evict for the next pass to fit
    bool passed_over = false;  // kList: a candidate was left out of the heap
    // kMark: the current pass's rows the next pass lacks (offsets in current_keys, and rows).
    // Once every row outside both passes is evicted (`outside_gone`), they are the only ones
    // begin_pass may evict.
    std::vector<uint32_t> spare_at;
    std::vector<sparse::row_index_t> spare_rows;
    bool evicts_all_outside = false;  // kList chose every row outside both passes
    bool outside_gone = false;        // ... and kErase removed them
    uint64_t evicted = 0;
    uint64_t chunks = 0;
    device::DeviceCounts counts;  // of the chunks
    double seconds = 0;
    // Lookup and insert scratch on the card, kept across chunks.
    device::device_buffer<uint64_t> d_keys;
    device::device_buffer<sparse::row_index_t> d_rows;
    device::device_buffer<float> d_floats;
    device::device_buffer<uint8_t> d_flags;
  };
  // prepare_next_pass's phases, one chunk each (card c): next_chunk runs the current phase's.
  void next_chunk(int c, NextPassCard& next);
  void next_lookup(int c, NextPassCard& next);
  // After the last look-up: whether room must be made first (kMark) or not (kInsert).
  void next_plan(int c, NextPassCard& next);
  void next_mark(int c, NextPassCard& next);
  void next_erase(int c, NextPassCard& next);
  void next_list(int c, NextPassCard& next);
  void next_insert(int c, NextPassCard& next);

  device::CardSet& cards_;
  std::vector<sparse::CardSparseStore*> stores_;
  table::HostTier& host_;
  PassManagerOptions options_;
  std::size_t row_budget_ = 0;
  CardTierPlan plan_;
  PassStats current_;
  double gather_seconds_ = 0;  // the last sync()'s slowest card, gathering rows (for the log)
  uint64_t kept_dirty_ = 0;    // dirty rows the last write-back kept on the cards (its `keep`)
  int64_t next_pass_id_ = 1;
  bool in_pass_ = false;
  PassAccess access_ = PassAccess::kTrain;  // of the current pass
  // kEvaluate: per card, the keys begin_pass placed there, taken off again by end_pass.
  std::vector<std::vector<uint64_t>> borrowed_;
  // Changes whenever the cards' key set changes other than by prepare_next_pass (begin_pass,
  // an evaluation's end_pass, clear): what a card remembered for the next pass is stale then.
  uint64_t key_generation_ = 0;
  std::vector<NextPassCard> next_;
};

}  // namespace pass
}  // namespace gpubox
