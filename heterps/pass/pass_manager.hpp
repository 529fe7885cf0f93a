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
//   end_pass()        rows changed during the pass (dirty) are pushed to the host tier, then
//                     marked clean. After it, the host tier holds exactly what the cards hold.
//                     If the host tier fails midway, the rows stay dirty on the cards, so a
//                     retried end_pass() (or sync()) completes the write-back; rows the host
//                     already acknowledged are simply written again (a full-row overwrite).
//
// Card memory: with a budget, every store is sized once for the budget's rows (hash slots, free
// list, dirty flags), rows arrive page by page, eviction reads only keys and scores (victims'
// rows go to the free list and the next pull reuses them), and write-back streams dirty rows a
// page at a time, so CardMemory's peak stays under plan().total_bytes() (tested).
//
// One trainer process: total cards == this process's cards (multi-trainer key exchange is not
// part of the pass manager yet). Calls are made from the controlling thread, between passes,
// never while card threads run steps. Stores and host tier are borrowed and must outlive it.
#pragma once

#include <cstdint>
#include <vector>

#include "heterps/device/card.hpp"
#include "heterps/pass/pass_types.hpp"
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
  // the model unchanged (PassAccess). Throws gpubox::Error when the host tier fails (after its
  // own retries) or the pass cannot fit.
  PassStats begin_pass(const std::vector<uint64_t>& keys, const std::vector<int32_t>& slots = {},
                       PassAccess access = PassAccess::kTrain);
  // Writes dirty rows back (after an evaluation pass: first takes the rows it borrowed off the
  // cards); returns this pass's counters (begin and end).
  PassStats end_pass();
  // Writes dirty rows back without ending the pass (before a save). Returns rows written.
  uint64_t sync();

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
  // Keys of one card with their slots (same length).
  struct CardKeys {
    std::vector<uint64_t> keys;
    std::vector<int32_t> slots;
  };
  // The pass's keys by owner card, sorted, without key 0 and duplicates (a repeated key keeps
  // its first slot).
  std::vector<CardKeys> partition_by_owner(const std::vector<uint64_t>& keys,
                                           const std::vector<int32_t>& slots) const;
  // Those of card `c`'s keys that are not on the card.
  CardKeys missing_on_card(int c, const CardKeys& mine);
  // Pulls `missing` from the host tier (created there with their slots when new; read with
  // HostTier::peek in an evaluation pass) into card `c`'s store. Returns how many rows the host
  // tier created (kEvaluate: how many keys it does not hold).
  std::size_t pull_to_card(int c, const CardKeys& missing);
  // Pushes every dirty row of card `c` to the host tier, then clears its dirty flags.
  uint64_t write_back(int c);
  // Removes `excess` rows of card `c` that are not in `pass_keys` (sorted), lowest score first,
  // reading only keys and scores (never a copy of the rows). Returns the rows removed.
  uint64_t evict(int c, const std::vector<uint64_t>& pass_keys, std::size_t excess);
  // Removes `keys` from card `c`'s store, a page of keys at a time. Returns the rows removed.
  uint64_t erase_from_card(int c, const std::vector<uint64_t>& keys);

  device::CardSet& cards_;
  std::vector<sparse::CardSparseStore*> stores_;
  table::HostTier& host_;
  PassManagerOptions options_;
  std::size_t row_budget_ = 0;
  CardTierPlan plan_;
  PassStats current_;
  int64_t next_pass_id_ = 1;
  bool in_pass_ = false;
  PassAccess access_ = PassAccess::kTrain;  // of the current pass
  // kEvaluate: per card, the keys begin_pass placed there, taken off again by end_pass.
  std::vector<std::vector<uint64_t>> borrowed_;
};

}  // namespace pass
}  // namespace gpubox
