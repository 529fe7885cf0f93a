// PassBoundary: the pass boundary of the pass manager (pass_manager.hpp holds the contract):
// begin_pass places a pass's rows on their owner cards (what the cards hold stays; room made by
// the store's eviction policy; staged rows inserted, the rest pulled), end_pass and sync write
// the dirty rows back to the host tier (pass_write_back.cpp). It uses what the next pass's card
// work (next_pass_work.hpp) did for the pass where that still holds.
//
// Controlling thread, between passes; its per-card parts run on the card threads
// (CardSet::run_on_cards).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.hpp"
#include "heterps/card_table/sparse_types.hpp"
#include "heterps/device/memory.hpp"
#include "heterps/pass/next_pass_work.hpp"
#include "heterps/pass/pass_cards.hpp"
#include "heterps/pass/pass_types.hpp"

namespace gpubox::pass {

class PassBoundary {
 public:
  // Both borrowed: they must outlive it.
  PassBoundary(PassCards& cards, NextPassWork& next_work)
      : cards_(cards), next_work_(next_work), write_back_buffers_(cards.num_cards()) {}

  // PassManager::begin_pass / end_pass / sync.
  PassStats begin_pass(const std::vector<uint64_t>& keys, const std::vector<int32_t>& slots,
                       const StagedRows* staged, PassAccess access);
  PassStats end_pass(const std::vector<uint64_t>& keep);
  uint64_t sync() { return write_back_all({}); }
  // Gives up the open pass without writing it back (PassManager::abandon_pass).
  void abandon_pass();
  // Empties every card's store, on the card threads (PassManager::clear_cards): the rows the
  // last write-back kept dirty go with them, and so does their count. Not during a pass.
  void clear_cards();
  // Dirty rows on the cards that the last write-back kept there (its `keep`): what make_room
  // spares besides the pass's rows. 0 after sync() or clear_cards(), not abandon_pass().
  uint64_t kept_dirty() const { return kept_dirty_; }

  const PassStats& current() const { return current_; }
  bool in_pass() const { return in_pass_; }
  PassAccess access() const { return access_; }

 private:
  // Replicated placement: card 0's pulled rows, shared with the other cards (pass_boundary.cpp).
  class ReplicaRows;
  // What begin_pass found and did on one card.
  struct CardMisses;
  struct CardBegin;
  // The slowest card's phases and the cards that used their early work, for the log line.
  struct BeginTimes {
    double lookup = 0, evict = 0, insert = 0, pull = 0;
    std::size_t early_cards = 0;
  };

  // Checks the arguments of begin_pass (and that no pass is on).
  void check_begin(const std::vector<uint64_t>& keys, const std::vector<int32_t>& slots,
                   const StagedRows* staged, PassAccess access) const;
  // begin_pass on card `c` (its thread): `mine` its keys, `early` the work done for them during
  // the previous pass when usable.
  CardBegin begin_on_card(int c, const OwnedKeys& mine, const StagedRows* staged,
                          NextPassCard* early, ReplicaRows& replica, PassAccess access);
  // Throws when card `c` cannot hold the pass's `n` rows (`access`: a training pass or an
  // evaluation, which the error names).
  void check_fits(int c, std::size_t n, PassAccess access) const;
  // The card's keys split into hits, missing staged, missing to pull: looked up now, or taken
  // from `early`.
  CardMisses find_missing(int c, const OwnedKeys& mine, const StagedRows* staged);
  static CardMisses take_early(NextPassCard& early);
  // Evicts what `misses` need room for; returns the rows removed.
  uint64_t make_room(int c, const CardMisses& misses, const NextPassCard* early);
  // Inserts the staged rows of the missing keys (`used`: offsets in card c's staged range).
  void insert_staged(int c, const StagedRows* staged, const std::vector<uint32_t>& used) const;
  // Pulls (or takes card 0's replica of) the rows staging left out. Returns the rows the host
  // tier created.
  std::size_t pull_rest(int c, const OwnedKeys& to_pull, ReplicaRows& replica,
                        PassAccess access) const;
  // Adds card `c`'s share to `stats` and `times`, with its early work `work` (used or not:
  // its evictions and chunks happened all the same).
  static void add_card(const CardBegin& done, const NextPassCard* work, const NextPassCard* early,
                       PassStats* stats, BeginTimes* times);
  void log_begin(const PassStats& stats, const BeginTimes& times) const;

  // Pushes every dirty row of card `c` but those of `keep` (sorted) to the host tier, then clears
  // their dirty flags; *kept = the dirty rows of `keep` left as they are. Adds the time spent
  // making batches ready on the card to *gather_seconds (pass_write_back.cpp).
  uint64_t write_back(int c, double* gather_seconds, const std::vector<uint64_t>& keep,
                      uint64_t* kept);
  // Of card `c`'s `count` dirty rows (keys[0, count), and their row indices on the card), drops
  // those of `keep` (sorted) from both lists, keeping the others' order. Returns how many were
  // dropped. Returns with d_rows' new contents still being copied in on the card's stream (from
  // the rows buffer): the caller's gathers on that stream, or the next write-back's waits before
  // it writes the buffer again, order that copy.
  std::size_t drop_kept(int c, const std::vector<uint64_t>& keep, uint64_t* keys, std::size_t count,
                        device::device_buffer<card_table::row_index_t>& d_rows);
  // Pushes card `c`'s rows d_rows[0, count) to the host tier (keys[0, count) theirs) a batch at
  // a time, each batch made ready on the card while the batches before are pushed, with one host
  // wait a batch: on cpu to a host tier that takes rows by address (reads_rows_in_place) the
  // rows' addresses listed into a pinned batch buffer and pushed where they lie
  // (HostTier::push_at); else the rows gathered off the card into a pinned batch buffer
  // (gather_batch) and pushed. Adds the card's time making batches
  // ready to *gather_seconds. Returns the first push error.
  Status push_rows(int c, const uint64_t* keys, std::size_t count,
                   const device::device_buffer<card_table::row_index_t>& d_rows,
                   double* gather_seconds);
  // One batch's pinned buffer in push_rows: its rows (gathered) or its rows' addresses (in
  // place), the other null.
  struct BatchSlot {
    float* rows = nullptr;
    const float** addresses = nullptr;
  };
  // Card c's first `slots` batch buffers of `batch` rows (or addresses when `in_place`), made
  // on first use and kept (WriteBackBuffers).
  std::vector<BatchSlot> batch_slots(int c, std::size_t slots, std::size_t batch, bool in_place);
  // Gathers card `c`'s rows d_rows[0, n) into `rows` (pinned) a staging half at a time
  // (gather_part; unstaged on cpu, half a page at a time), then waits for the copy stream.
  // *parts counts the parts of the write-back so far (part p uses staging half p % 2).
  void gather_batch(int c, const card_table::row_index_t* d_rows, std::size_t n, float* rows,
                    std::size_t* parts);
  // One part of a batch in push_rows: gathers card `c`'s rows d_rows[0, m) into staging half
  // `half` (0 or 1; 0 only with a page of one row) and copies them into `rows` (pinned) on the
  // card's copy stream, ordered by events only: the gather waits for the half's last copy, the
  // copy for the gather. cpu, but under GPUBOX_DEVICE_CHECK=defer: the gather writes `rows`
  // itself, with the same events and waits. Returns with both queued.
  void gather_part(int c, const card_table::row_index_t* d_rows, std::size_t m, float* rows,
                   std::size_t half);
  // write_back on every card; sets kept_dirty_ and gather_seconds_. Returns the rows written.
  uint64_t write_back_all(const std::vector<uint64_t>& keep);

  // One card's memory for its write-back, pinned and on the card, kept from one write-back to
  // the next (a pass's end allocates only when it needs more than every earlier one did:
  // cudaMallocHost and cudaFreeHost wait for the whole device, and after the first end_pass a
  // pass boundary makes no card allocation on the write-back's path). Touched only by the card's
  // thread; freed with the PassBoundary.
  struct WriteBackBuffers {
    device::pinned_buffer<uint64_t> keys;  // the dirty rows' keys, read back from the card
    // drop_kept's: the dirty rows' indices on the card, and PassCards::keep_rows of the keep keys
    // and of the rows found for them.
    device::pinned_buffer<card_table::row_index_t> rows;
    device::pinned_buffer<uint64_t> keep;
    device::pinned_buffer<card_table::row_index_t> found;
    // Up to pulls_in_flight + 1 batches of rows (gathered) or of their addresses (in place:
    // reads_rows_in_place), one being made ready on the card while the others' pushes run.
    std::vector<device::pinned_buffer<float>> batches;
    std::vector<device::pinned_buffer<const float*>> addresses;
    // On the card: the listing, the keep page and the staging page are card c's kept buffers
    // (PassCards::kept, CardPassBuffers), which begin_pass borrows too.
    // Per staged half: its gather's end (card stream) and its copy's end (copy stream).
    std::vector<device::Event> gathered, copied;
    bool made = false;  // the events were made on card c (buffers())

    // Pinned host bytes held (PassStats::write_back_pinned_bytes).
    std::size_t pinned_bytes() const;
  };
  // Card c's write-back buffers, their events made on card c on first use (card c's thread).
  WriteBackBuffers& buffers(int c);

  PassCards& cards_;
  NextPassWork& next_work_;
  std::vector<WriteBackBuffers> write_back_buffers_;  // per card (buffers())
  PassStats current_;
  // The last sync()'s slowest card, making its batches ready (gathering rows off the card, or
  // listing their addresses: push_rows), for the log.
  double gather_seconds_ = 0;
  uint64_t kept_dirty_ = 0;  // dirty rows the last write-back kept on the cards (its `keep`)
  int64_t next_pass_id_ = 1;
  bool in_pass_ = false;
  PassAccess access_ = PassAccess::kTrain;  // of the current pass
  // kEvaluate: per card, the keys begin_pass placed there, taken off again by end_pass.
  std::vector<std::vector<uint64_t>> borrowed_;
};

}  // namespace gpubox::pass
