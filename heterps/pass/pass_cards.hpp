// PassCards: what every job of the pass manager (pass_manager.hpp) shares: this process's cards,
// their stores, the host tier, the options and the card budget with its footprint plan, and the
// row moves each job makes on one card (split by owner, look up, pull from the host tier, insert
// and erase a page at a time). The jobs (pass_boundary.hpp, pass_staging.hpp,
// next_pass_work.hpp) hold it by reference; PassManager owns it.
//
// Per-card calls (int c) are made by card c's thread (CardSet::run_on_cards), or by the
// controlling thread while no card thread runs. Stores and host tier are borrowed and must
// outlive it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "common/status.hpp"
#include "heterps/card_table/sparse_types.hpp"
#include "heterps/device/card.hpp"
#include "heterps/device/memory.hpp"
#include "heterps/pass/card_tier_plan.hpp"
#include "heterps/pass/host_call_workers.hpp"
#include "heterps/pass/pass_types.hpp"
#include "table/host_tier.hpp"

namespace gpubox {
namespace card_table {
class CardSparseStore;
}

namespace pass {

// Throws gpubox::Error "what: <status>" when `st` is not ok (a host-tier call failed after its
// own retries).
void throw_host_error(const Status& st, const std::string& what);

// The wait for card `card`'s stream between two steps of a pass, where the step's collectives
// may still be in flight (device rule 6): returns once the stream's work so far has finished, or
// throws gpubox::Error when that cannot happen in time (a peer that never joins a pending
// collective) or the group was aborted. The card tier's owner gives the communicator's
// (comm::Communicator::synchronize: the group's timeout, abort-aware); `what` names the wait.
using CardWait = std::function<void(int card, const device::Stream& stream, const char* what)>;

// One card's pass-boundary memory on the card, made on its first use and kept from pass to pass
// (held also while the steps run), so that after the first pass a pass boundary allocates no card
// memory: every job borrows it in turn, never two at once, on the card's thread and stream (their
// contents are lost between borrowers). CardTierPlan counts all of it (card_tier_plan.cpp).
// - The listing, keys and row indices (12 bytes a row): the write-back lists the dirty rows into
//   it; begin_pass's look-up the pass's keys; evict_outside every key on the card (then ranks them
//   in the keys' room), compact_pool the keys and rows it moves; a rehash of the table (a purge of
//   erased slots) saves its pairs there (card_table::RehashRoom); resident_keys lists into it;
//   erase_from_card stages its keys there, evict_among its rows, ranks and dirty flags (in the
//   keys' room), and insert_to_card its keys, records (in the keys' room) and rows, when it holds
//   more than a page (under a budget: every erase at once, one wait). Reserved
//   for the row budget's rows once (no budget: it grows with the table, by half again). Within
//   the plan's working set per key.
// - A page of PassCards::keep_rows keys and row indices, and a staging page of
//   PassCards::page_rows_kept rows (two halves of staging_rows, gathered and copied in turn by the
//   write-back): drop_kept's keep keys, insert_to_card's, erase_from_card's and evict_among's
//   pages when the listing holds less, and the write-back's copy off the card.
//   Bounded by PassCards::kKeptRows whatever the page: the plan's kept_bytes.
struct CardPassBuffers {
  device::device_buffer<uint64_t> listed_keys;
  device::device_buffer<card_table::row_index_t> listed_rows;
  device::device_buffer<uint64_t> page_keys;
  device::device_buffer<card_table::row_index_t> page_rows;
  device::device_buffer<float> staged;
  bool made = false;  // given the card's memory (PassCards::kept)
};

// Where a pass-boundary job stages its rows on a card, a batch at a time: CardPassBuffers'
// listing (its keys and rows) when that holds more of them at once than its pages, else the
// pages (page_keys and page_rows). Nothing allocated either way (kept_room).
struct KeptRoom {
  uint64_t* keys = nullptr;
  card_table::row_index_t* rows = nullptr;
  std::size_t entries = 0;  // a batch's most
  bool in_listing = false;
};

class PassCards {
 public:
  // stores[i] belongs to cards.card(i). Sizes every store for the budget once (card memory:
  // card_tier_plan.cpp).
  PassCards(device::CardSet& cards, std::vector<card_table::CardSparseStore*> stores,
            table::HostTier& host, const PassManagerOptions& options);

  device::CardSet& cards() const { return cards_; }
  device::Card& card(int c) const { return cards_.card(c); }
  card_table::CardSparseStore& store(int c) const { return *stores_[static_cast<std::size_t>(c)]; }
  std::size_t num_cards() const { return stores_.size(); }
  table::HostTier& host() const { return host_; }
  // Floats per row (host tier and cards alike).
  std::size_t stride() const { return static_cast<std::size_t>(host_.layout().stride()); }
  const PassManagerOptions& options() const { return options_; }
  bool replicated() const { return options_.placement == heter_comm::Placement::kReplicated; }
  // The threads of this process's host-tier calls (begin_pass's pulls, the write-back's pushes):
  // one window of pulls_in_flight calls for each card's thread and one more, made once (a caller
  // beyond those waits for a free thread).
  HostCallWorkers& host_calls() const { return host_calls_; }
  // A staging's pulls (fetch_staged): pulls_in_flight threads of their own, lowered by
  // options().staging_nice, so the staging runs below the steps as its thread does.
  HostCallWorkers& staging_calls() const { return staging_calls_; }
  // Rows per card the budget allows (0 = unlimited), and the footprint at it.
  std::size_t row_budget() const { return row_budget_; }
  const CardTierPlan& plan() const { return plan_; }
  // What the plan is made from: the first store, the options and the cards.
  CardTierShape shape() const;
  // The footprint of `rows` rows per card with these stores (monotone in rows).
  CardTierPlan plan_for(std::size_t rows) const { return pass::plan_for(shape(), rows); }
  // The kept page buffers of CardPassBuffers (all but the listing: the write-back's, lent to
  // begin_pass), for pages of `page_rows` rows: a page, but at most
  // kKeptRows rows whatever the page (a default page of 4 MiB holds 65536 rows of 14 floats,
  // 4.3 MiB a card kept; 4096 rows are 272 KiB, and a half of 2048 such rows is a 112 KiB copy;
  // collective_test's 7 MiB budget with rows of 72 bytes holds rows with 4096, none with 8192):
  // a staging page of staging_halves() halves of staging_rows() rows each, gathered and copied in
  // turn (two halves; a page of one row is one half), and keep_rows() keys, their rows and a flag
  // each.
  // kept_bytes_for (card_tier_plan.hpp): their card bytes (CardTierPlan::kept_bytes).
  static constexpr std::size_t kKeptRows = 4096;
  static std::size_t keep_rows(std::size_t page_rows) { return std::min(kKeptRows, page_rows); }
  static std::size_t staging_halves(std::size_t page_rows) { return page_rows >= 2 ? 2 : 1; }
  static std::size_t staging_rows(std::size_t page_rows) {
    return std::max<std::size_t>(1, keep_rows(page_rows) / staging_halves(page_rows));
  }
  // Rows of the whole staging page (at most keep_rows): the most that insert_to_card stages and
  // evict_among ranks at once.
  static std::size_t page_rows_kept(std::size_t page_rows) {
    return staging_halves(page_rows) * staging_rows(page_rows);
  }
  // The card bytes an allocation of `bytes` takes: CUDA's stream-ordered pool hands out multiples
  // of 256 bytes (the cpu backend's exact bytes fit within), as the kept buffers are counted.
  static std::size_t allocated_bytes(std::size_t bytes) { return (bytes + 255) / 256 * 256; }
  // Card c's kept pass-boundary buffers (CardPassBuffers), given card c's memory and sized on
  // first use. Card c's thread.
  CardPassBuffers& kept(int c) const;
  // The card bytes the kept page buffers of CardPassBuffers hold (all but the listing), on the
  // card that holds most: at most the plan's kept_bytes. Between passes or while the steps run.
  std::size_t kept_page_bytes() const;
  // Replicated placement: the table (`rows` rows per card) does not fit the budget. Throws.
  [[noreturn]] void fail_table_over_budget(std::size_t rows) const;
  // The bounded wait for a card's stream between steps (CardWait); without one (cards with no
  // collectives, as in the pass manager's own tests) wait_between_steps is Stream::synchronize.
  // Set before the steps start.
  void set_card_wait(CardWait wait) { card_wait_ = std::move(wait); }
  // Card c's thread, between two steps: waits for card c's stream through the CardWait given
  // (`what` names the wait in its error). Counts one host synchronization.
  void wait_between_steps(int c, const char* what) const;

  // The pass's keys by owner card, sorted, without key 0 and duplicates (a repeated key keeps
  // its first slot). Replicated: every card's list is every key.
  std::vector<OwnedKeys> partition_by_owner(const std::vector<uint64_t>& keys,
                                            const std::vector<int32_t>& slots) const;
  // Every key on this process's cards (Replicated: card 0's), in no particular order.
  std::vector<uint64_t> resident_keys() const;
  // Those of card `c`'s keys that are not on the card; `hit_rows` receives the row indices of
  // the others. 12 bytes per key on the card, in card c's kept listing (kept(c)).
  OwnedKeys missing_on_card(int c, const OwnedKeys& mine,
                            std::vector<card_table::row_index_t>* hit_rows) const;
  // Pulls the rows of `n` keys (created with their slots when new; read with HostTier::peek,
  // creating nothing, when `access` is kEvaluate) into `rows`, in batches of host_batch_keys
  // with up to pulls_in_flight requests at once on `workers` (host_calls or staging_calls), and
  // runs `finish(begin, end)` for each batch in order as it arrives. Returns the rows the host tier
  // created (kEvaluate: the keys it does not hold); throws naming `what` when it fails. Any thread:
  // touches only the host tier.
  std::size_t pull_rows(HostCallWorkers& workers, PassAccess access, const uint64_t* keys,
                        const int32_t* slots, std::size_t n, float* rows,
                        const std::function<void(std::size_t, std::size_t)>& finish,
                        const std::string& what) const;
  // Pulls `missing` from the host tier (as pull_rows) into card `c`'s store, inserting batch by
  // batch as the requests complete. Returns pull_rows' count. `keep` (optional) receives the
  // pulled rows (packed in the order of missing.keys), for the replicas that share them.
  std::size_t pull_to_card(int c, const OwnedKeys& missing, PassAccess access,
                           std::vector<float>* keep = nullptr) const;
  // Inserts `n` rows (host memory, packed in the order of `keys`) into card `c`'s store, staged
  // on the card in its kept listing, as many at a time as it holds (rows_staged_in_listing: under
  // a budget 8 bytes for each of the budget's rows), or in its kept pages (page_rows_kept rows)
  // when they hold more or the store has width classes (their grouping by pool takes the store's
  // scratch, per row, that the plan counts for a kept page); at most host_batch_keys at a time.
  // One wait per chunk. The caller's phase must not hold the listing.
  void insert_to_card(int c, const uint64_t* keys, const float* rows, std::size_t n) const;
  // Rows of `stride` floats that `lent`'s listing stages at once: each row's key and record in
  // the listed keys' room, its row index in the listed rows' room.
  static std::size_t rows_staged_in_listing(const CardPassBuffers& lent, std::size_t stride);
  // `lent`'s listing when it holds more entries at once (`listed`, as the job uses it) than its
  // pages (`paged`), else its pages.
  static KeptRoom kept_room(CardPassBuffers& lent, std::size_t listed, std::size_t paged);
  // Removes `keys` from card `c`'s store, as many at a time as kept(c)'s listing holds (under a
  // budget: all of them, one wait), or keep_rows keys (its page of keys) if more: the caller's
  // phase must not hold the listing. Returns the rows removed.
  uint64_t erase_from_card(int c, const std::vector<uint64_t>& keys) const;

 private:
  device::CardSet& cards_;
  std::vector<card_table::CardSparseStore*> stores_;
  table::HostTier& host_;
  PassManagerOptions options_;
  std::size_t row_budget_ = 0;
  CardTierPlan plan_;
  CardWait card_wait_;
  mutable std::vector<CardPassBuffers> kept_;  // per card (kept())
  mutable HostCallWorkers host_calls_;         // last: joined first
  mutable HostCallWorkers staging_calls_;
};

}  // namespace pass
}  // namespace gpubox
