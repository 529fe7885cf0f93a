// Plain data of the pass manager: options and per-pass counters. Host code (the trainer's
// pass line, the metrics file) includes this without device headers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "heterps/heter_comm/heter_comm_types.hpp"

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
  // Added to the nice value of the threads that run a staging's host-tier pulls
  // (PassManager::fetch_staged; runner.staging_nice, as the pipeline's staging thread itself):
  // made once with the pass manager, they do not inherit the staging thread's nice value.
  int staging_nice = 0;
  // The next pass's card work done between the current pass's steps
  // (PassManager::prepare_next_pass, runner.next_pass_chunk_keys): at most this many keys (or
  // table slots / 8 when listing) per chunk; 0 = off (begin_pass does all of it). Under a card
  // budget a chunk is at most a sixteenth of the budget's rows (at least 4096 keys): the work's
  // scratch is sized for a chunk and counted in the plan (next_pass_scratch_sizes).
  std::size_t next_pass_chunk_keys = 0;
  // > 0: each chunk is sized so that it costs the card about this fraction of a training step's
  // card time (measured with timing events, adapted chunk by chunk: ChunkPacer), at most
  // next_pass_chunk_keys; 0: every chunk takes next_pass_chunk_keys. The GPU build paces (a GPU
  // step is far shorter than a chunk sized for the CPU); the cpu build sizes by keys.
#if defined(GPUBOX_BACKEND_CUDA)
  double next_pass_step_fraction = 0.25;
#else
  double next_pass_step_fraction = 0;
#endif
  // runner.host_memory_mb (bytes) when the host tier is this process's table, else 0 (none, or
  // gpubox_server's tables, whose budget is theirs): the next pass's card work's pinned host
  // memory, every local card's, counts in it, and the host table plans its rows with what is
  // left (CardTierPlan::host_table_bytes). A budget that leaves the table less than
  // host_table_min_bytes fails when the plan is made (at start), naming the key, the need and the
  // cards.
  std::size_t host_memory_bytes = 0;
  // The least of host_memory_bytes the host table needs for itself (the trainer's:
  // table::smallest_memory_budget, and 1 MiB at least): under it the table's plan would keep
  // one row and a small index a shard past its share, silently.
  std::size_t host_table_min_bytes = std::size_t{1} << 20;
  // kReplicated (Collective mode): every card holds every key of every pass, nothing is evicted
  // (a table over the budget fails, naming its size), and end_pass writes back one replica (the
  // first local card's; the others only drop their dirty flags).
  heter_comm::Placement placement = heter_comm::Placement::kSharded;
  // cpu backend: end_pass and sync push the dirty rows to the host tier where they lie on the
  // card, by their addresses (HostTier::push_at), instead of gathering them into pinned batches
  // first (card memory is the host's there: the gather was a second copy of every row), when
  // the host tier reads rows where they lie (HostTier::pushes_by_address: the in-process table,
  // not a remote one). false: gathered, as cuda always does (the host cannot read card memory),
  // and as the cpu backend does under GPUBOX_DEVICE_CHECK=defer (whose deferred streams check
  // the gather's events) or to a remote host tier.
  bool write_back_in_place = true;
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
  std::size_t working_bytes = 0;   // pass-boundary working set, insert scratch included
  // The write-back's staging and keep buffers, held on the card from pass to pass (while the
  // steps, the next pass's card work and begin_pass run too): beside the working set, not in it.
  std::size_t kept_bytes = 0;
  // The next pass's card work's scratch (NextPassScratch: its chunks' card buffers), made by the
  // first pass that runs the work and kept from pass to pass beside the steps: 0 when the work
  // cannot run (next_pass_work_possible).
  std::size_t next_pass_bytes = 0;
  // The pinned host memory the same scratch holds per card (its chunks' readbacks and uploads,
  // NextPassScratch's h_*), kept as long: host memory, so not in total_bytes (card bytes), but in
  // the host budget when there is one (host_budget_bytes). 0 when the work cannot run; with no
  // card budget, at the unbudgeted chunk (next_pass_chunk_keys).
  std::size_t next_pass_pinned_bytes = 0;
  // PassManagerOptions::host_memory_bytes (0: no host budget counts the pinned term) and
  // host_table_min_bytes, and the local cards, each of which pins next_pass_pinned_bytes.
  std::size_t host_budget_bytes = 0;
  std::size_t host_table_min_bytes = 0;
  int cards = 1;
  // With width classes (slot_dims): (embedx width, bytes of its rows) per class, narrowest
  // first; each class has its own pool. `rows` are planned at the widest class's row_bytes (any
  // mix of widths fits), plus a partly used page of every pool. Empty with one class.
  std::vector<std::pair<int32_t, std::size_t>> class_row_bytes;
  std::size_t total_bytes() const {
    return row_page_bytes + table_bytes + index_bytes + working_bytes + kept_bytes +
           next_pass_bytes;
  }
  double bytes_per_key() const;
  // What every local card's next pass's card work pins (cards * next_pass_pinned_bytes).
  std::size_t pinned_host_bytes() const {
    return static_cast<std::size_t>(cards) * next_pass_pinned_bytes;
  }
  // The host table's share of host_budget_bytes once pinned_host_bytes() is counted in it: the
  // rest (0: no budget). Throws gpubox::Error naming runner.host_memory_mb, the need, the cards
  // and the least budget that does when that leaves the table less than host_table_min_bytes.
  std::size_t host_table_bytes() const;
  // "card tier per card: R rows in P MiB (rows X, table Y, index Z, pass working set W, kept
  // pass-boundary buffers K, next pass's card work N), B bytes
  // per key (row size S)" or, without a budget, the per-key figure at the worst table fill; with
  // width classes, the row bytes of each; when the next pass's card work runs, "; next pass's
  // card work pins H MiB of host memory per card" and whether a host budget counts it.
  std::string to_string() const;
};

// Keys of one card with their slots (same length), sorted and unique.
struct OwnedKeys {
  std::vector<uint64_t> keys;
  std::vector<int32_t> slots;
};

// A coming pass made ready while an earlier pass trains (PassManager::stage_rows,
// runner.prefetch_passes): its keys split by owner card, and the host-tier rows of those no pass
// between the fetch and its begin_pass touches, so a staged row is the value begin_pass would
// pull (pass_manager.hpp). Made in two steps: plan_staging (the keys, known once the pass is
// read) and fetch_staged (the rows, from the host tier: `fetched`). Owned by the caller; handed
// to that pass's begin_pass once fetched.
struct StagedRows {
  std::vector<OwnedKeys> owned;       // per local card: the pass's keys it owns (no key 0)
  std::vector<uint64_t> keys;         // staged keys by owner card, sorted within each card
  std::vector<std::size_t> card_end;  // card c's staged keys: [card_end[c - 1], card_end[c])
  std::vector<float> rows;            // the host-tier row of keys[i] at [i * stride, ...)
  bool fetched = false;               // `rows` hold every staged key's row (fetch_staged done)
  std::size_t created = 0;            // rows the host tier created for this fetch (new keys)
  double seconds = 0;                 // the fetch's wall time
  std::size_t bytes() const {
    std::size_t total = keys.size() * sizeof(uint64_t) + rows.size() * sizeof(float);
    for (const OwnedKeys& card : owned)
      total += card.keys.size() * (sizeof(uint64_t) + sizeof(int32_t));
    return total;
  }
};

// How far a coming pass's staging is, as the next pass's card work sees it
// (PassManager::expect_next_pass polls it from the card threads). `staged` is set once its keys
// are planned (owned, keys and card_end final: the card work's look-ups and evictions need only
// those); `rows_ready` once its rows are fetched (the inserts need them). A fetch that failed
// never becomes ready: the cards then insert nothing, and its begin_pass gets no staged rows.
struct StagingProgress {
  const StagedRows* staged = nullptr;
  bool rows_ready = false;
};

// Counters of one pass, summed over this trainer's cards (the trainer's pass report prints
// them: trainer/engine/trainer_steps.cpp).
struct PassStats {
  int64_t pass_id = 0;
  uint64_t keys_in_pass = 0;   // unique keys handed to begin_pass (after key 0 was dropped)
  uint64_t hits = 0;           // already on their owner card
  uint64_t pulled = 0;         // fetched from the host tier by begin_pass itself
  uint64_t prefetched = 0;     // taken from rows staged ahead (StagedRows) instead
  uint64_t created = 0;        // of pulled + prefetched, rows the host tier created (new keys;
                               // none in a kEvaluate pass)
  uint64_t evicted = 0;        // rows removed from cards to make room
  uint64_t written_back = 0;   // dirty rows pushed to the host tier by end_pass / sync
  uint64_t kept_dirty = 0;     // dirty rows end_pass left on the cards for the next pass (keep)
  uint64_t rows_on_cards = 0;  // after begin_pass / end_pass
  // Pinned host memory the write-back holds after end_pass, this trainer's cards together: kept
  // from pass to pass for the pass manager's life (pass_manager.hpp: about (pulls_in_flight + 1)
  // batches of rows a card, or on cpu to the in-process table of the rows' addresses
  // (write_back_in_place), 8-12 bytes a dirty row), outside the host tier's budget.
  uint64_t write_back_pinned_bytes = 0;
  // Of the card work for this pass done during the previous pass's steps
  // (PassManager::prepare_next_pass; counted in `prefetched` and `evicted` too): staged rows
  // inserted and rows evicted then, and what its chunks asked of the device layer, summed over
  // the cards (not part of any step's counts), and the slowest card's time in them. Evictions
  // and chunks count even when begin_pass could not use the work (a failed staging, an
  // evaluation pass between).
  uint64_t early_inserted = 0;
  uint64_t early_evicted = 0;
  uint64_t early_chunks = 0;
  uint64_t early_host_syncs = 0;
  uint64_t early_allocations = 0;
  uint64_t early_launches = 0;
  double early_seconds = 0;
  double begin_seconds = 0;
  double end_seconds = 0;
};

}  // namespace gpubox::pass
