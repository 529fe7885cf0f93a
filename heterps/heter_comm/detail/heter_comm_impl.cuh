// HeterComm::Impl, the step engine behind heter_comm.hpp: its state and the helpers its parts
// share. Portable device code (included only by the engine's .cu files):
//   heter_comm.cu          the step: pull, push, push_pulled; the exchanges, the merges, the update
//   heter_comm_plan.cu     the key plan (dedup and owner counts, planned or all-gathered) and the
//                          buffers' sizes (reserve_steps, reserve_exchange)
//   heter_comm_checks.cu   the owner's lookups of a planned step and their late checks, and the
//                          missing keys of an unplanned one (created, or a failure naming them)
//   heter_comm_padded.cu   a planned step at the pass's fixed sizes (padded), as step graphs
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/error.hpp"
#include "heterps/card_table/card_store.cuh"
#include "heterps/comm/communicator.hpp"
#include "heterps/device/composed_step.hpp"
#include "heterps/device/exec_policy.cuh"
#include "heterps/device/late_readback.hpp"
#include "heterps/device/memory.hpp"
#include "heterps/device/parallel_for.cuh"
#include "heterps/device/reduce.cuh"
#include "heterps/device/step_graph.hpp"
#include "heterps/heter_comm/detail/key_dedup.cuh"
#include "heterps/heter_comm/heter_comm.hpp"
#include "heterps/heter_comm/segment_reduce.cuh"
#include "table/sparse_row/optimizer.hpp"

namespace gpubox::heter_comm {
namespace detail {

using card_table::kRowPrefetchDistance;
using card_table::row_index_t;

// merged[m] = what came with merged key m's first received occurrence: the row the pull found
// for it (push_pulled), or its slot (created rows, push). `count` (card memory, may be null): the
// merged keys when known only on the card; positions past it are left alone.
template <class T>
struct GatherMerged {
  const T* received;
  const position_t* sorted_pos;
  const position_t* segment_start;
  T* merged;
  const position_t* count;
  GPUBOX_HD void operator()(std::size_t m) const {
    if (count != nullptr && m >= *count) return;
    merged[m] = received[sorted_pos[segment_start[m]]];
  }
};

// Owner side of pull: the record of each received key, one thread per (record, field) so that
// neighbouring threads write neighbouring floats.
struct FillPullRecords {
  card_table::CardStoreRef store;
  const row_index_t* rows;
  std::size_t count;  // records
  float* records;
  int32_t dim;
  GPUBOX_HD void operator()(std::size_t item) const {
    const std::size_t r = item / static_cast<std::size_t>(dim);
    const int32_t f = static_cast<int32_t>(item % static_cast<std::size_t>(dim));
    if (f == 0 && r + kRowPrefetchDistance < count) {
      store.prefetch_read(rows[r + kRowPrefetchDistance]);
    }
    // A missing key (a planned step checks misses late: StepCheck) reads zeros, not past the
    // pool; the step fails when its check retires.
    records[item] = rows[r] == card_table::kInvalidRow
                        ? 0.0f
                        : table::pull_record_field(store.row(rows[r]), store.layout(), f);
  }
#if !defined(GPUBOX_BACKEND_CUDA)
  // cpu: a record's fields in one call (one division, one row look-up and one read of the row's
  // layout per record, not per field), the same values and prefetches as the per-field form.
  void run_range(std::size_t begin, std::size_t end) const {
    const auto d = static_cast<std::size_t>(dim);
    for (std::size_t item = begin; item < end;) {
      const std::size_t r = item / d;
      const std::size_t f = item - r * d;
      const std::size_t stop = std::min(end, (r + 1) * d);
      if (f == 0 && r + kRowPrefetchDistance < count) {
        store.prefetch_read(rows[r + kRowPrefetchDistance]);
      }
      if (rows[r] == card_table::kInvalidRow) {
        std::fill(records + item, records + stop, 0.0f);
      } else {
        table::pull_record_fields(store.row(rows[r]), store.layout(), static_cast<int32_t>(f),
                                  static_cast<int32_t>(f + (stop - item)), records + item);
      }
      item = stop;
    }
  }
#endif
};

// One optimizer step per merged key (keys are distinct, so rows are too: no races). Nothing
// when the step was vetoed on the card (push_pulled's veto word), nor for a key the lookup did
// not find (a planned step's miss, reported by its late check).
struct ApplyUpdates {
  card_table::CardStoreRef store;
  const row_index_t* rows;
  const uint64_t* keys;
  const float* grads;
  table::AccessorConfig config;
  const uint32_t* veto;          // null, or apply only while *veto == kNoVeto
  std::size_t count;             // merged keys (a bound when live_count is given)
  const position_t* live_count;  // null, or the merged keys on the card (<= count)
  // adam_bias_correction per_table: the table's step, advanced for this one (AdvanceTableStep);
  // null per_row.
  const table::optimizer::TableAdamStep* table_step;
  GPUBOX_HD void operator()(std::size_t m) const {
    if (veto != nullptr && *veto != kNoVeto) return;
    const std::size_t live = live_count != nullptr ? *live_count : count;
    if (m >= live || rows[m] == card_table::kInvalidRow) return;
    if (m + kRowPrefetchDistance < live) store.prefetch_update(rows[m + kRowPrefetchDistance]);
    const table::RowLayout& layout = store.layout();
    table::optimizer::apply_push(store.row(rows[m]), layout, config, keys[m],
                                 grads + m * static_cast<std::size_t>(layout.push_dim()),
                                 table_step);
    store.mark_dirty(rows[m]);
  }
};

// adam_bias_correction per_table: the table's step advances once a push step (whether or not
// the card owns a key of it, so every card counts the same), not when the step is vetoed (its
// updates are not applied); one work item, enqueued before the step's ApplyUpdates (inside its
// step graph when captured, so a replay advances it too).
struct AdvanceTableStep {
  table::optimizer::TableAdamStep* step;
  float beta1;
  float beta2;
  const uint32_t* veto;
  GPUBOX_HD void operator()(std::size_t) const {
    if (veto != nullptr && *veto != kNoVeto) return;
    table::optimizer::advance_table_adam(*step, beta1, beta2);
  }
};
struct SetTableSteps {
  table::optimizer::TableAdamStep* step;
  int64_t steps;
  GPUBOX_HD void operator()(std::size_t) const { *step = table::optimizer::TableAdamStep{steps}; }
};

// The late check of a planned step, written on the card after its lookups (StepCheck's words;
// read kCheckDepth steps later at the latest): the misses, the received position of the first
// missing key (n when none) and that key, the owner merge's distinct keys, then the card's own
// count row (what the plan said it was), from the local dedup's owner_begin.
inline constexpr std::size_t kCheckHead = 4;

// How many planned steps' checks may be pending before the oldest is read (the late checks'
// ring of pinned slots): a check is read at most this many steps after its step.
inline constexpr std::size_t kCheckDepth = 4;

// What the host knows of a planned step when its check retires (LateReadback's tag).
struct StepCheck {
  int64_t pass = -1;  // the communicator's step context (-1: none, e.g. an evaluation)
  int64_t step = -1;
  std::vector<uint64_t> planned_row;      // the plan's counts for this card's row
  std::vector<std::size_t> recv_offsets;  // where each source card's keys start (received)
  bool pushed = false;                    // push_pulled applied the step's merge
  bool merge_late = false;                // its merged count was known only on the card
  // A padded step's (PaddedSteps): the received keys sit in blocks of `block` per source card,
  // so the source of received position i is i / block (recv_offsets is not used).
  std::size_t block = 0;
};

// A planned step at the pass's fixed sizes (heter_comm_padded.cu): every kernel and collective of
// pull and push_pulled runs over the pass's largest batch (`occurrences` positions, the batch's
// own count read on the card) and exchanges fixed blocks of `block` keys per pair of cards (the
// largest count any card sends any owner in a step of the pass; replicated, the largest distinct
// count of any card's batch, all-gathered), each key block led by its live count. Nothing the step
// enqueues depends on the step, so it is captured once as a step graph per set of pointers (the
// "sparse pull" and "sparse push" graphs) and replayed. Buffers are its own (an unpadded step
// between two padded ones changes none of them).
struct PaddedSteps {
  explicit PaddedSteps(device::Card& card)
      : send_keys(0, card.memory(), card.stream()),
        recv_keys(0, card.memory(), card.stream()),
        keys(0, card.memory(), card.stream()),
        rows(0, card.memory(), card.stream()),
        recv_records(0, card.memory(), card.stream()),
        send_records(0, card.memory(), card.stream()),
        merged_records(0, card.memory(), card.stream()),
        merged_rows(0, card.memory(), card.stream()),
        unique_slot(0, card.memory(), card.stream()),
        misses(1, card.memory(), card.stream()) {}

  // What a capture bakes in besides the buffers (which the memory generation covers).
  struct PullKey {
    const uint64_t* keys = nullptr;
    const uint64_t* n_on_card = nullptr;
    float* out = nullptr;
    bool operator==(const PullKey& o) const {
      return keys == o.keys && n_on_card == o.n_on_card && out == o.out;
    }
  };
  struct PushKey {
    const float* grads = nullptr;
    uint32_t* veto = nullptr;
    NormClipState* clip = nullptr;
    bool operator==(const PushKey& o) const {
      return grads == o.grads && veto == o.veto && clip == o.clip;
    }
  };
  template <class Key>
  struct Cached {
    explicit Cached(const char* name) : graph(name) {}
    Key key{};
    uint64_t generation = 0;
    std::size_t occurrences = 0;
    std::size_t block = 0;
    device::StepGraph graph;
  };
  // Pull graphs kept: the trainer's two upload buffers and a short last batch's.
  static constexpr std::size_t kPullGraphs = 4;

  bool enabled() const { return block > 0; }
  std::size_t slots(int cards) const { return static_cast<std::size_t>(cards) * block; }

  std::size_t occurrences = 0;             // positions of every padded batch (the pass's largest)
  std::size_t block = 0;                   // keys per pair of cards (0: no padded steps)
  std::vector<std::size_t> key_counts;     // block + 1 per card (the all_to_all's counts)
  std::vector<std::size_t> record_counts;  // block * record dim per card
  std::vector<std::size_t> push_counts;    // block * push dim per card
  // [dst][count, keys...]: block + 1 each (replicated: one block, to every card)
  device::device_buffer<uint64_t> send_keys;
  device::device_buffer<uint64_t> recv_keys;  // [src][count, keys...]
  device::device_buffer<uint64_t> keys;       // owner: the key of received slot src * block + j
  device::device_buffer<row_index_t> rows;    // owner: its row (kInvalidRow for a dead slot)
  // Owner: records of the received slots (replicated pull: of this card's own block)
  device::device_buffer<float> recv_records;
  // Sender: records by slot (dst * block + j), then one discard row per unique index (a unique
  // key past the live count, or past its block when a plan is wrong, sums into its own).
  device::device_buffer<float> send_records;
  device::device_buffer<float> merged_records;
  device::device_buffer<row_index_t> merged_rows;
  device::device_buffer<position_t> unique_slot;  // sender: unique key u's slot or discard row
  device::device_buffer<unsigned long long> misses;
  std::vector<std::unique_ptr<Cached<PullKey>>> pulls;  // most recently used first
  // HeterComm::pull_only's ("sparse lookup"), kept as `pulls` are.
  std::vector<std::unique_ptr<Cached<PullKey>>> lookups;
  std::unique_ptr<Cached<PushKey>> push;
};

inline void add_stats(HeterCommStats& total, const HeterCommStats& step) {
  total.scratch_allocations += step.scratch_allocations;
  total.pull_calls += step.pull_calls;
  total.push_calls += step.push_calls;
  total.keys_in += step.keys_in;
  total.unique_keys_sent += step.unique_keys_sent;
  total.owner_lookups += step.owner_lookups;
  total.merged_updates += step.merged_updates;
  total.created_on_pull += step.created_on_pull;
  total.created_on_push += step.created_on_push;
  total.bytes_sent += step.bytes_sent;
  total.bytes_sent_remote += step.bytes_sent_remote;
}

}  // namespace detail

using detail::add_stats;
using detail::AdvanceTableStep;
using detail::ApplyUpdates;
using detail::FillPullRecords;
using detail::GatherMerged;
using detail::kCheckDepth;
using detail::kCheckHead;
using detail::kRowPrefetchDistance;
using detail::PaddedSteps;
using detail::row_index_t;
using detail::SetTableSteps;
using detail::StepCheck;

class HeterComm::Impl {
 public:
  Impl(device::Card& card, card_table::CardSparseStore& store, comm::Communicator& comm,
       const HeterCommOptions& options);

  // Host waits: unplanned, the key counts (S1) and the owner's lookups (S2); planned, none.
  // Returns with the records enqueued.
  void pull(const uint64_t* keys, const int32_t* slots, std::size_t n, float* out_pull,
            const device::Stream& stream);

  void push(const uint64_t* keys, const int32_t* slots, std::size_t n, const float* grads,
            uint32_t* veto, NormClipState* clip, const device::Stream& stream);

  void push_pulled(const float* grads, uint32_t* veto, NormClipState* clip,
                   const device::Stream& stream);

  // HeterComm::pull_only: a padded pull runs lookup_padded, any other is pull() (after which
  // push_pulled is refused).
  void pull_only(const uint64_t* keys, std::size_t n, float* out_pull,
                 const device::Stream& stream);

  // Retires every pending check of a planned step (waits for the card only where one's copy has
  // not completed); throws the first failure, naming its pass and step.
  void drain_checks();

  const table::RowLayout& layout() const { return layout_; }
  // HeterComm::table_steps, set_table_steps.
  int64_t table_steps() const;
  void set_table_steps(int64_t steps);
  int rank() const { return comm_->rank(); }
  int total_cards() const { return total_cards_; }
  const HeterCommStats& stats() const { return stats_; }
  const HeterCommStats& last_step() const { return last_; }

 private:
  // Device rule 1: every buffer the rest of the step needs (this pull or push, and the
  // push_pulled after a pull), sized before the first collective that moves keys.
  void reserve_exchange(std::size_t unique, std::size_t received);

  // Grows every exchange buffer, the owner merge, the lookups' and reductions' scratch to what
  // exchange_received_, exchange_unique_ and exchange_max_unique_ (and `occurrences` local keys)
  // need; sizes (and contents) as the growth leaves them.
  void grow_exchange(std::size_t occurrences);
  // Capacity for `count` elements, contents not kept.
  template <class T>
  static void grow(device::device_buffer<T>& buffer, std::size_t count) {
    if (count > buffer.capacity()) buffer.resize_discard(count);
  }

 public:
  // Refuses a plan whose row width is not this placement's (see PlannedCounts).
  void plan_next_step(const PlannedCounts& counts, const uint64_t* n_on_card);

  HeterCommMemory memory() const;

  void reserve_steps(const StepBounds& bounds);

  // Whether a planned pull given its occurrence count on the card runs padded (the pass was
  // reserved for padded steps): then it and its push_pulled wait for nothing and enqueue only
  // capturable work.
  bool pads_planned_steps() const { return padded_.enabled(); }

 private:
  // One summed push record per unique key of the planned batch, written in send order.
  void reduce_local(const float* grads, std::size_t unique, const device::Stream& stream);

  // Sends the summed records to the owners, along the keys' route.
  void send_records(std::size_t received, const device::Stream& stream);

  // Replicated placement's exchange: every card's `mine` (its unique count of records of `dim`
  // elements, in send order) lands in `out` on every card, grouped by source card in rank order
  // (the layout the owner receives with all_to_all_v). The blocks are padded to the largest
  // unique count so that one all_gather moves them (in place in `gathered`, sized by
  // reserve_exchange), then packed; `mine` needs no padding.
  template <class T>
  void gather_blocks(device::device_buffer<T>& gathered, const T* mine, std::size_t dim, T* out,
                     const device::Stream& stream);

  // Merges, on the owner, the records of one key from every source card (summed in source-rank
  // order), following the owner merge plan of `merged` distinct keys.
  void merge_records(std::size_t merged, const device::Stream& stream);

  // The merge plan of the `received` keys (distinct keys and their occurrences), enqueued; its
  // count is read by collect_owner_merge after the caller's next wait. A single card receives
  // only its own unique, ascending keys: nothing to merge, nothing to wait for.
  void plan_owner_merge_async(std::size_t received, const device::Stream& stream);
  std::size_t collect_owner_merge(std::size_t received);

  // One optimizer step per merged key (merged_rows_ holds their rows), rows marked dirty; none
  // when `veto` (card memory) does not hold kNoVeto.
  // `merged` is a bound when merged_on_card_ is set (a planned step): its count is added to
  // stats() when the step's check retires.
  void apply_updates(std::size_t merged, const uint32_t* veto, const device::Stream& stream);
  // Clipping by global norm (`clip` non-null, card memory): the squares of the `merged` records'
  // gradients that their rows (`rows`) step (live: merged_on_card_ when set) summed over every
  // card's owned keys (one all-reduce when sharded on several cards; replicated, every card
  // merged every key), the factor into clip->factor, and the records' gradients scaled by it; a
  // norm that is not finite writes kNonFiniteNorm into *veto instead (ClipFactor). Capturable, no
  // wait: everything it reads of `clip` is read on the card.
  void clip_merged(float* records, const row_index_t* rows, std::size_t merged, NormClipState* clip,
                   uint32_t* veto, const device::Stream& stream);
  // push's and push_pulled's precondition on their `clip`: a veto word to write a non-finite
  // norm's verdict into (`form` names the call in the error).
  void expect_veto_with_clip(const char* form, const uint32_t* veto,
                             const NormClipState* clip) const;
  // adam_bias_correction per_table: enqueues the table's next step (AdvanceTableStep, none when
  // vetoed) and returns where ApplyUpdates reads it; null per_row (nothing enqueued).
  const table::optimizer::TableAdamStep* advance_table_step(const uint32_t* veto,
                                                            const device::Stream& stream);

  // A planned step's owner side without a wait: the lookups and the merge plan stay on the card
  // (merged_ = the received count, a bound; merged_on_card_ = the count), and the step's check
  // (misses, merge count, the card's own count row against the plan) is copied into the late
  // checks' next slot, read kCheckDepth steps later or by drain_checks.
  void look_up_on_card(std::size_t received, const device::Stream& stream);

  // Runs `op` (which may retire checks); a failure forgets the checks still pending.
  template <class Op>
  void guarded(Op&& op) {
    try {
      op();
    } catch (...) {
      checks_.discard();
      last_check_ = nullptr;
      throw;
    }
  }
  // retire_check as the ring's check.
  struct RetireCheck {
    Impl* impl;
    void operator()(const StepCheck& tag, const uint64_t* words) const {
      impl->retire_check(tag, words);
    }
  };

  // A planned step's check, read late: the card's own counts must be the plan's (the keys moved
  // by the plan's counts; a plan that does not describe the batch sends keys to the wrong
  // owner), and no key may be missing on its owner (missing_keys = fail: the step read zeros
  // for it and skipped its update). Throws naming the step's pass and step.
  void retire_check(const StepCheck& tag, const uint64_t* words);

  void begin_step() {
    last_ = HeterCommStats{};
    scratch_before_ = scratch_.overflow_allocations();
  }
  void finish_step() {
    last_.scratch_allocations = scratch_.overflow_allocations() - scratch_before_;
    add_stats(stats_, last_);
  }

  // Local dedup and per-owner grouping of the batch's keys, all on the card; the per-owner
  // counts of every card are all-gathered into the count matrix and read back in one wait
  // (S1). Sets the send and receive counts; returns the unique count. With kCreate, each card's
  // row also says whether it `sends_slots`: every card must, or none (send_slots is one more
  // collective, and an int32 exchange paired with another card's uint64 key exchange hangs or
  // moves garbage). Every card reads the same matrix, so on a mismatch every card fails here,
  // with the same error, before any payload moves.
  std::size_t plan_keys(const uint64_t* keys, std::size_t n, bool sends_slots,
                        const device::Stream& stream);

  // plan_keys's agreement (kCreate): the slots flag after each card's `row_size` counts. A
  // mismatch fails every card with the same message, naming the cards on each side.
  void check_slots_agree(std::size_t row_size) const;

  // With MissingKeyPolicy::kCreate and the occurrences' slots: sends each planned unique key's
  // slot to its owner along with the key (recv_slots_, in recv_keys_'s order), so that a missing
  // key is created at its slot's width. One more collective; the trainer (kFail) never sends
  // them. Sizes its buffers first (the step's collectives have not started). Returns whether it
  // sent them.
  bool send_slots(const int32_t* slots, std::size_t unique, std::size_t received,
                  const device::Stream& stream);

  // Padded steps (heter_comm_padded.cu). Whether the pull of these `n` keys runs padded: planned,
  // kFail, with its count on the card, within the reserved sizes.
  bool pull_is_padded(std::size_t n) const;
  // A padded step's plan (plan_next_step's counts) into host_counts_, refused when an entry is
  // past the block; returns this card's unique keys and the keys it receives (looks up).
  std::pair<std::size_t, std::size_t> padded_counts(const uint64_t* planned);
  // The start a padded pull and a padded lookup share: the step's plan taken (its live count on
  // the card, padded_counts), the pull state reset, the step's counts begun for `n` keys (what
  // it looks up on the owners is the caller's).
  struct PaddedStart {
    const uint64_t* n_on_card;
    std::size_t unique;
    std::size_t received;
  };
  PaddedStart begin_padded_step(std::size_t n);
  // Whether a pass reserved with `bounds` runs padded steps (pair_block > 0, kFail, padded
  // steps on).
  bool pads(const StepBounds& bounds) const {
    return bounds.pair_block > 0 && options_.missing_keys == MissingKeyPolicy::kFail &&
           options_.padded_steps;
  }
  // Sizes the padded steps' buffers for `bounds` (when pads(bounds)), by placement, zeroed (their
  // dead parts are moved but never read: zero, they are never uninitialised memory).
  void reserve_padded(const StepBounds& bounds);
  // The padded pull and push_pulled: the host's part (counts from the plan, the late check's
  // slot), the card's part as a step graph (or eagerly: step graphs off).
  void pull_padded(const uint64_t* keys, std::size_t n, float* out_pull,
                   const device::Stream& stream);
  void push_padded(const float* grads, uint32_t* veto, NormClipState* clip,
                   const device::Stream& stream);
  // A padded pull for a step that pushes nothing (pull_only): the host's part as pull_padded's,
  // the card's (enqueue_padded_lookup) as the "sparse lookup" graph; leaves nothing to push.
  void lookup_padded(const uint64_t* keys, std::size_t n, float* out_pull,
                     const device::Stream& stream);
  // A padded pull's late check: its words into the ring slot the card's counter names, its tag
  // (pass, step, this card's planned row, `merge_late`), the slot committed; returns the tag.
  StepCheck& commit_padded_check(StepCheck& tag, const device::Stream& stream, bool merge_late);
  // The card's parts: fixed sizes, no host wait, no allocation (capturable).
  void enqueue_padded_lookup(const uint64_t* keys, const uint64_t* n_on_card, float* out_pull,
                             const device::Stream& stream);
  void enqueue_padded_pull(const uint64_t* keys, const uint64_t* n_on_card, float* out_pull,
                           const device::Stream& stream);
  void enqueue_padded_push(const float* grads, uint32_t* veto, NormClipState* clip,
                           const device::Stream& stream);
  // Replays `graph` (capturing `work` first when its capture is stale), or runs `work` when step
  // graphs are off.
  template <class Cached, class Work>
  void run_graph(Cached& cached, const device::Stream& stream, Work&& work);

  // Sends the planned unique keys to their owners; recv_keys_ (sized by reserve_exchange) gets
  // the keys this card owns, grouped by source card.
  void send_keys(const device::Stream& stream);

  void count_bytes(const std::size_t* send_counts, std::size_t element_bytes);

  // The `missing` keys among keys[0, n) that the lookup did not find (rows[i] == kInvalidRow):
  // created (rows filled in, count returned) or a failure, as the options say. `merge` (push)
  // maps a merged key back to a received position, to name the requesting card; null when keys
  // are the received keys themselves. `with_slots`: recv_slots_ holds the received keys' slots
  // (send_slots), so created rows take their slot's width; else slot 0's. Runs after a wait: it
  // may allocate and synchronize.
  std::size_t resolve_missing(const uint64_t* keys, std::size_t n, row_index_t* rows,
                              const detail::KeyDedup* merge, bool with_slots, std::size_t missing,
                              const device::Stream& stream);

  card_table::CardSparseStore* store_;
  comm::Communicator* comm_;
  HeterCommOptions options_;
  table::RowLayout layout_;
  table::AccessorConfig config_;
  int total_cards_;
  bool replicated_;  // Placement::kReplicated

  device::ScratchArena& scratch_;  // the card's: Thrust temporaries (a missing key's search)
  detail::KeyDedup local_;         // dedup and owner plan of this card's batch (send order)
  detail::KeyDedup owner_merge_;
  SegmentReducer<float> reducer_;  // local and owner merges of push records

  // Host-side counts (elements) per peer: keys sent (the plan's or the all-gathered row), keys
  // received.
  std::vector<std::size_t> send_counts_;
  std::vector<std::size_t> recv_counts_;
  std::vector<std::size_t> recv_offsets_;
  std::vector<std::size_t> send_scaled_;
  std::vector<std::size_t> recv_scaled_;
  // Row r (count_words_ each) = what card r sends to each card (all-gathered), and its host copy.
  std::size_t count_words_;
  device::device_buffer<uint64_t> count_matrix_;
  device::pinned_buffer<uint64_t> host_counts_;

  device::device_buffer<uint64_t> recv_keys_;
  device::device_buffer<row_index_t> recv_rows_;
  device::device_buffer<float> recv_records_;    // owner side: records received / to send back
  device::device_buffer<float> send_records_;    // sender side: records in send order
  device::device_buffer<float> merged_records_;  // owner side: one summed push per key
  device::device_buffer<row_index_t> merged_rows_;
  // Replicated: every card's block, padded to max_unique_ (the largest unique count of the step).
  device::device_buffer<uint64_t> gathered_keys_;
  device::device_buffer<float> gathered_records_;
  std::size_t max_unique_ = 0;
  // MissingKeyPolicy::kCreate with slots (send_slots): the planned keys' slots in send order,
  // the received keys' (recv_keys_'s order), the merged keys' (push), and the replicated blocks.
  device::device_buffer<int32_t> send_slots_;
  device::device_buffer<int32_t> recv_slots_;
  device::device_buffer<int32_t> merged_slots_;
  device::device_buffer<int32_t> gathered_slots_;
  // What the exchange buffers are sized for (reserve_exchange): received and unique keys.
  std::size_t exchange_received_ = 0;
  std::size_t exchange_unique_ = 0;
  std::size_t exchange_max_unique_ = 0;
  device::pinned_buffer<position_t> host_probe_;
  // plan_next_step's count matrix for the next pull or push (borrowed, consumed by plan_keys).
  const uint64_t* planned_ = nullptr;
  bool step_planned_ = false;  // the last plan_keys used a plan (named in a missing key's error)
  // The owner merge's count on the card, when the host knows only a bound (a planned pull).
  const position_t* merged_on_card_ = nullptr;
  // Planned steps' late checks: WriteStepCheck's words on the card, and the ring of pinned
  // slots they are read from; the last committed check's tag (push_pulled marks it pushed).
  device::device_buffer<uint64_t> check_words_;
  device::LateReadback<uint64_t, StepCheck> checks_;
  StepCheck* last_check_ = nullptr;

  // Planned steps at the pass's fixed sizes, as step graphs (heter_comm_padded.cu).
  device::Card* card_;
  PaddedSteps padded_;
  const uint64_t* planned_n_ = nullptr;  // plan_next_step's occurrence count on the card
  bool padded_pulled_ = false;           // the last pull was padded: so is its push_pulled
  std::size_t padded_n_ = 0;             // that pull's occurrences

  // clip_merged's reduction: its partials (sized with the merge buffers) and the sparse squares.
  device::device_buffer<double> clip_partials_;
  device::device_buffer<double> clip_squares_;

  // adam_bias_correction per_table: the table's step on this card (1 element; empty per_row).
  device::device_buffer<table::optimizer::TableAdamStep> table_step_;

  HeterCommStats stats_;
  HeterCommStats last_;
  // The plan, received keys, their rows and the owner merge describe the last pull
  // (push_pulled reuses them); merged_ is that merge's count of distinct keys.
  bool pulled_ = false;
  std::size_t merged_ = 0;
  std::size_t scratch_before_ = 0;
};

}  // namespace gpubox::heter_comm
