// Plain data of the pass manager: options and per-pass counters. Host code (the trainer's
// pass line, the metrics file) includes this without device headers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace gpubox::pass {

struct PassManagerOptions {
  // Card budget per card, in rows (0 = none). When both budgets are set the smaller wins.
  std::size_t card_row_budget = 0;
  // Card budget per card in bytes (runner.card_memory_mb): the most rows whose whole card-tier
  // footprint (CardTierPlan) fits.
  std::size_t card_memory_bytes = 0;
  // Keys per host-tier request; up to `pulls_in_flight` requests run at once.
  std::size_t host_batch_keys = 1 << 16;
  int pulls_in_flight = 4;
};

// What a pass does with the rows it places on the cards.
enum class PassAccess {
  // Steps pull and push: keys new to the host tier are created there (with their slot), and
  // end_pass writes the changed rows back.
  kTrain,
  // Steps only pull (evaluation, --mode infer): keys the cards lack are read from the host tier
  // without changing it (HostTier::peek; a key it does not hold reads as the accessor's initial
  // row and is stored nowhere), and end_pass takes them off the cards again. The host tier stays
  // byte for byte as it was, and so does the card tier's key set unless the budget made
  // begin_pass evict rows (those are clean: their values stay in the host tier).
  kEvaluate,
};

// What the card tier of one card holds at its row budget, from the real capacities: rows in
// whole pages, the hash table at its power-of-two slot count, per-row index memory, and the
// largest working set a pass boundary adds on top (eviction scores, rehash, write-back list,
// and one page of staged rows). CardMemory's peak stays under total_bytes() (tested).
struct CardTierPlan {
  std::size_t rows = 0;            // row budget per card (0: none; the figures are per key)
  std::size_t row_bytes = 0;       // one row of the sparse layout
  std::size_t page_rows = 0;       // rows per pool page
  std::size_t row_page_bytes = 0;  // pages holding `rows` rows
  std::size_t table_bytes = 0;     // hash slots (16 bytes each) for `rows` keys at the load bound
  std::size_t index_bytes = 0;     // free list, dirty flags, page table
  std::size_t working_bytes = 0;   // pass-boundary working set, staging page included
  std::size_t total_bytes() const {
    return row_page_bytes + table_bytes + index_bytes + working_bytes;
  }
  double bytes_per_key() const;
  // "card tier per card: R rows in P MiB (rows X, table Y, index Z, pass working set W), B bytes
  // per key (row size S)" or, without a budget, the per-key figure at the worst table fill.
  std::string to_string() const;
};

// Counters of one pass, summed over this trainer's cards (the trainer's pass report prints
// them: trainer/engine/trainer.cpp).
struct PassStats {
  int64_t pass_id = 0;
  uint64_t keys_in_pass = 0;   // unique keys handed to begin_pass (after key 0 was dropped)
  uint64_t hits = 0;           // already on their owner card
  uint64_t pulled = 0;         // fetched from the host tier
  uint64_t created = 0;        // of those, rows the host tier created (never seen before;
                               // none in a kEvaluate pass)
  uint64_t evicted = 0;        // rows removed from cards to make room
  uint64_t written_back = 0;   // dirty rows pushed to the host tier by end_pass / sync
  uint64_t rows_on_cards = 0;  // after begin_pass / end_pass
  double begin_seconds = 0;
  double end_seconds = 0;
};

}  // namespace gpubox::pass
