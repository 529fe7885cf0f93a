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
  // Card budget per card in bytes (runner.card_memory_mb); converted to rows with the row size
  // plus the hash table's per-key overhead (see rows_for_bytes).
  std::size_t card_memory_bytes = 0;
  // Keys per host-tier request; up to `pulls_in_flight` requests run at once.
  std::size_t host_batch_keys = 1 << 16;
  int pulls_in_flight = 4;
};

// Counters of one pass, summed over this trainer's cards.
struct PassStats {
  int64_t pass_id = 0;
  uint64_t keys_in_pass = 0;   // unique keys handed to begin_pass (after key 0 was dropped)
  uint64_t hits = 0;           // already on their owner card
  uint64_t pulled = 0;         // fetched from the host tier
  uint64_t created = 0;        // of those, rows the host tier created (never seen before)
  uint64_t evicted = 0;        // rows removed from cards to make room
  uint64_t written_back = 0;   // dirty rows pushed to the host tier by end_pass / sync
  uint64_t rows_on_cards = 0;  // after begin_pass / end_pass
  double begin_seconds = 0;
  double end_seconds = 0;

  // "keys: K, hits: H, pulled: P, created: C, evicted: E, written_back: W, begin_pass: Bs,
  // end_pass: Es"
  std::string to_string() const;
  // The same counters as JSON members (no braces): "\"keys_in_pass\": K, ...".
  std::string json_members() const;
};

}  // namespace gpubox::pass
