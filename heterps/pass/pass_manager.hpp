// PassManager: moves sparse rows between the host tier and the cards at pass boundaries, with
// the card tier kept as a cache across passes. It is the pass half of tier_owner::CardTier (the
// card tier's owner, Paddle's PSGPUWrapper role: heterps/card_tier/card_tier.hpp), which builds it
// over its stores; schedules talk to the CardTier.
//
//   begin_pass(keys)  keys already on their owner card stay; only the missing ones are pulled
//                     from the host tier (in batches, several in flight) and inserted on their
//                     owner. If a card's budget would be exceeded, rows not needed by this pass
//                     are evicted first, in the order of the card store's eviction policy
//                     (by default the lowest score first; they are clean: the previous
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
// page at a time, so CardMemory's peak stays under plan().total_bytes() (tested). The pass
// boundary keeps its card buffers from pass to pass (its listing of keys and row indices, 12
// bytes a row, made for the budget's rows once, lent to begin_pass's look-up and eviction; a page
// of keep keys and rows; on cuda the write-back's staging page): after the first end_pass a pass
// boundary allocates card memory only where a pass needs more than every one before (no budget:
// the listing grows by half again with the table). They stay held while the steps run.
//
// Pinned host memory: the write-back keeps its pinned buffers from one end_pass or sync() to the
// next, for the manager's life (cudaMallocHost and cudaFreeHost wait for the whole device), and
// never shrinks them. Per card that writes back (card 0 only when Replicated), about
//   (pulls_in_flight + 1) * host_batch_keys * stride * 4 bytes   rows, a batch per buffer
//     (on cpu to the in-process table, which takes the rows where they lie on the card,
//     write_back_in_place: 8 bytes, a row's address, instead of stride * 4)
// + 8 bytes * the most dirty rows one write-back listed            their keys
// + 4 bytes * as many, + 12 bytes * page_rows                       with a non-empty keep
// (fewer batch buffers while no write-back had as many batches). The keys' and row indices'
// buffers grow by half again, so they can hold up to 1.5x the most dirty rows. With the defaults
// (4 in flight, 65536 keys) and rows of 72 bytes, 23.6 MB of batches a card (2.6 MB of addresses
// in place), plus 0.08 GB for 10 M dirty rows (0.12 GB with a keep), up to 1.5x those when the
// dirty rows grew pass by pass.
// Not in plan() (card memory) nor in the host tier's budget: each end_pass reports it
// (PassStats::write_back_pinned_bytes; the pass line's write_back_pinned_mb) and logs it.
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
//                     Memory while it runs: on the card, scratch for the chunks in flight (up to
//                     ChunkChain::kDepth = 5 on the GPU build; their keys and rows, 12 bytes each
//                     and as much pinned host memory; while listing, two chunks of 8 slots a key,
//                     every slot's key, row, rank and dirty flag, 17 bytes each on the card and as
//                     much pinned; while inserting, two regions of staged rows, a chunk's or a
//                     page's whichever is smaller, half a chunk's under a budget, on the card and
//                     as much pinned), made by the first pass that runs the work and kept from
//                     pass to pass (a later pass allocates no card or pinned memory for it),
//                     counted by plan() as next_pass_bytes (its pinned memory as
//                     next_pass_pinned_bytes, host memory outside the card's total and inside
//                     the host budget, options.host_memory_bytes, when one is given; under a budget
//                     a chunk is at most a sixty-fourth of its rows and at least 256 keys (the rows
//                     if fewer): about 4.5 bytes a row at rows of 18 floats, a small part of any
//                     budget), beside the steps' own buffers, which plan() never counted, and the
//                     pass boundary's kept buffers (its listing, 12 bytes a row, a page of keep
//                     keys and rows and the write-back's staging page); on the host, per next-pass
//                     key on the card its row index (4 bytes) and per staged key its offset (4),
//                     per current-pass row the next lacks its row and key offset (8), a byte per
//                     pool row, and (score, key, row) of the rows outside both passes (24 bytes),
//                     at most as many as must leave, until they are erased. The current pass's
//                     keys are shared with its data set, not copied.
//
// The three jobs live in their own objects (PassManager is their facade): the pass boundary
// (pass_boundary.hpp: begin_pass, end_pass and write-back), staging ahead (pass_staging.hpp) and
// the next pass's card work (next_pass_work.hpp), over what they share (pass_cards.hpp: the
// cards, stores, host tier, budget and the row moves on one card). Which rows leave a card
// first is the card store's eviction policy (heterps/card_table/eviction_policy.hpp).
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
#include "heterps/pass/next_pass_work.hpp"
#include "heterps/pass/pass_boundary.hpp"
#include "heterps/pass/pass_cards.hpp"
#include "heterps/pass/pass_types.hpp"
#include "table/host_tier.hpp"

namespace gpubox {
namespace card_table {
class CardSparseStore;
}

namespace pass {

class PassManager {
 public:
  // stores[i] belongs to cards.card(i).
  PassManager(device::CardSet& cards, std::vector<card_table::CardSparseStore*> stores,
              table::HostTier& host, const PassManagerOptions& options = {});
  // Its jobs hold each other by reference: it stays where it was built.
  PassManager(const PassManager&) = delete;
  PassManager& operator=(const PassManager&) = delete;

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
  // Does nothing (sizes nothing either) when next_pass_chunk_keys is 0, the placement or widths
  // rule it out, or the cards belong to several trainers (nothing is staged for them). Throws
  // when prepare_next_pass ran since this training pass's begin_pass (a step ran: its sizing
  // would wait beside the step's collectives). Sizes each card on its own thread.
  void expect_next_pass(std::shared_ptr<const std::vector<uint64_t>> current_keys,
                        const std::function<StagingProgress()>& poll);
  // Card thread `c`, between two steps of the current pass: one chunk of the next pass's card
  // work (above). Returns false when there is none now: not expected, its keys not planned yet,
  // waiting for its rows (looked up and room made), or done.
  bool prepare_next_pass(int c);
  // Empties every card's store (CardTier::clear; not during a pass): forgets the next pass's
  // work, and the rows the last end_pass kept dirty go with the cards (kept_dirty() is 0).
  void clear_cards();
  // Dirty rows on the cards that the last end_pass kept there (its `keep`), not written back
  // since: 0 after sync() or clear_cards() (abandon_pass() leaves it to the clear that follows).
  uint64_t kept_dirty() const { return boundary_.kept_dirty(); }
  // Gives up the open pass (if any) without writing its rows back: a pass whose write-back failed
  // (a restarted server) and whose rows the caller drops with the cards' contents
  // (CardTier::abandon_pass empties them), reloading a save instead.
  void abandon_pass() {
    if (boundary_.in_pass()) boundary_.abandon_pass();
  }
  // The wait for a card's stream between steps, beside their collectives (PassCards::CardWait):
  // the card tier's owner gives its communicator's bounded wait. Without one, the next pass's
  // work waits with Stream::synchronize (right for cards that run no collectives). Set before
  // the steps start.
  void set_card_wait(CardWait wait) { cards_.set_card_wait(std::move(wait)); }
  // Where card c's next-pass work is (kOff when none is expected): for tests and logs.
  NextPassCard::Phase next_pass_phase(int c) const { return next_.phase(c); }
  // Fault injection for tests (NextPassWork::fail_chunk_after): the chunk of the next pass's
  // card work in `phase` that begins after `ok_chunks` more (every card's together) throws at
  // `point`, as a device fault would there; the work stops on that card (kOff), the card exact.
  void fail_next_pass_chunk_after(int64_t ok_chunks, NextPassCard::Phase phase,
                                  NextPassWork::ChunkFault point) {
    next_.fail_chunk_after(ok_chunks, phase, point);
  }

  // Rows per card the budget allows (0 = unlimited).
  std::size_t row_budget() const { return cards_.row_budget(); }
  // The card tier's footprint per card at the row budget (with no budget: for one key), for the
  // log line at the start of training.
  const CardTierPlan& plan() const { return cards_.plan(); }
  // The footprint of `rows` rows per card with these stores (monotone in rows).
  CardTierPlan plan_for(std::size_t rows) const { return cards_.plan_for(rows); }
  // Card bytes the pass boundary keeps from pass to pass beside its listing (the kept pages of
  // PassCards::kept, which begin_pass and end_pass borrow; each allocation at
  // PassCards::allocated_bytes), at most plan().kept_bytes.
  std::size_t pass_boundary_kept_card_bytes() const { return cards_.kept_page_bytes(); }
  // Pinned host bytes the next pass's card work keeps between passes (NextPassWork's kept
  // scratch), on the card that holds most: at most plan().next_pass_pinned_bytes. Between
  // begin_pass and the next expect_next_pass.
  std::size_t next_pass_kept_pinned_bytes() const { return next_.kept_pinned_bytes(); }
  const PassStats& current() const { return boundary_.current(); }
  bool in_pass() const { return boundary_.in_pass(); }

 private:
  PassCards cards_;
  NextPassWork next_;
  PassBoundary boundary_;
};

}  // namespace pass
}  // namespace gpubox
