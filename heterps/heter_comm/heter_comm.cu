// HeterComm's step engine (see heter_comm.hpp). Portable device code: Thrust on the card's
// stream (device::exec_policy) and parallel_for functors; the communicator moves the data.
//
// Step flow and host waits (device rules in heterps/device/card.hpp): an unplanned pull waits
// twice — S1 for the per-owner key counts (all-gathered on the cards, read back together), S2
// for the owner's miss count and merge count (read back together) — and returns with its
// records enqueued; push_pulled waits at its end (S3). With the step's counts planned
// (plan_next_step, the trainer's steps) a pull waits for nothing: the counts come from the plan,
// the merge count stays on the card (the merge kernels run over the received count, a bound, and
// skip the segments past it), and the checks that the plan described the batch and that no key was
// missing are written on the card and read a few steps late (StepCheck, drain_checks). Every buffer
// is sized before the keys move, so nothing is allocated while a collective is in flight.
#include <thrust/find.h>

#include <algorithm>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "common/error.hpp"
#include "heterps/card_table/card_store.cuh"
#include "heterps/comm/communicator.hpp"
#include "heterps/device/exec_policy.cuh"
#include "heterps/device/late_readback.hpp"
#include "heterps/device/memory.hpp"
#include "heterps/device/parallel_for.cuh"
#include "heterps/heter_comm/detail/key_dedup.cuh"
#include "heterps/heter_comm/heter_comm.hpp"
#include "heterps/heter_comm/segment_reduce.cuh"
#include "table/sparse_row/optimizer.hpp"

namespace gpubox::heter_comm {
namespace {

using card_table::kRowPrefetchDistance;
using card_table::row_index_t;

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
};

// out[i] = the record of occurrence i's unique key (records are in send order, which is the
// unique keys' order: KeyDedup groups them by owner). One thread per (occurrence, field):
// coalesced reads and writes.
struct ScatterRecords {
  const float* records;
  const position_t* occurrence_unique;
  float* out;
  int32_t dim;
  GPUBOX_HD void operator()(std::size_t item) const {
    const std::size_t i = item / static_cast<std::size_t>(dim);
    const std::size_t f = item % static_cast<std::size_t>(dim);
    out[item] = records[static_cast<std::size_t>(occurrence_unique[i]) * dim + f];
  }
};

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

// send_slots[u] = the slot of unique key u's first occurrence (a key that comes in two slots of
// one batch takes the first one's: the sort is stable, so the same every run).
struct SendOrderSlots {
  const int32_t* slots;
  const position_t* sorted_pos;
  const position_t* unique_start;
  int32_t* send_slots;
  GPUBOX_HD void operator()(std::size_t u) const {
    send_slots[u] = slots[sorted_pos[unique_start[u]]];
  }
};

// The late check of a planned step, written on the card after its lookups (StepCheck's words;
// read kCheckDepth steps later at the latest): the misses, the received position of the first
// missing key (n when none) and that key, the owner merge's distinct keys, then the card's own
// count row (what the plan said it was), from the local dedup's owner_begin.
inline constexpr std::size_t kCheckHead = 4;
struct WriteStepCheck {
  const unsigned long long* misses;
  const row_index_t* rows;
  const uint64_t* keys;
  std::size_t n;
  const position_t* merged;     // null: n
  const position_t* own_begin;  // row_size + 1 entries
  std::size_t row_size;
  uint64_t* words;
  GPUBOX_HD void operator()(std::size_t) const {
    const uint64_t missing = *misses;
    words[0] = missing;
    words[1] = n;
    words[2] = 0;
    if (missing > 0) {  // the error path: one thread finds the first
      for (std::size_t i = 0; i < n; ++i) {
        if (rows[i] != card_table::kInvalidRow) continue;
        words[1] = i;
        words[2] = keys[i];
        break;
      }
    }
    words[3] = merged != nullptr ? *merged : n;
    for (std::size_t c = 0; c < row_size; ++c) {
      words[kCheckHead + c] = own_begin[c + 1] - own_begin[c];
    }
  }
};

// *word = value, on the card (a flag next to the counts that S1 all-gathers).
struct WriteWord {
  uint64_t* word;
  uint64_t value;
  GPUBOX_HD void operator()(std::size_t) const { *word = value; }
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
  GPUBOX_HD void operator()(std::size_t m) const {
    if (veto != nullptr && *veto != kNoVeto) return;
    const std::size_t live = live_count != nullptr ? *live_count : count;
    if (m >= live || rows[m] == card_table::kInvalidRow) return;
    if (m + kRowPrefetchDistance < live) store.prefetch_update(rows[m + kRowPrefetchDistance]);
    const table::RowLayout& layout = store.layout();
    table::optimizer::apply_push(store.row(rows[m]), layout, config, keys[m],
                                 grads + m * static_cast<std::size_t>(layout.push_dim()));
    store.mark_dirty(rows[m]);
  }
};

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
};

void add_stats(HeterCommStats& total, const HeterCommStats& step) {
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

}  // namespace

class HeterComm::Impl {
 public:
  Impl(device::Card& card, card_table::CardSparseStore& store, comm::Communicator& comm,
       const HeterCommOptions& options)
      : store_(&store),
        comm_(&comm),
        options_(options),
        layout_(store.layout()),
        config_(store.config()),
        total_cards_(comm.size()),
        replicated_(options.placement == Placement::kReplicated),
        scratch_(card.scratch()),
        // Replicated: every card gets every key, so the keys are not grouped by owner (one
        // destination) and all_gather stands in for all_to_all_v.
        local_(card, replicated_ ? 1 : comm.size()),
        owner_merge_(card, 1),
        reducer_(card),
        send_counts_(comm.size(), 0),
        recv_counts_(comm.size(), 0),
        recv_offsets_(comm.size() + 1, 0),
        send_scaled_(comm.size(), 0),
        recv_scaled_(comm.size(), 0),
        // Sharded: what card r sends each card; replicated: card r's unique count. With kCreate
        // one more word: whether card r sends slots (agreed in plan_keys).
        count_words_((replicated_ ? 1 : comm.size()) +
                     (options.missing_keys == MissingKeyPolicy::kCreate ? 1 : 0)),
        count_matrix_(static_cast<std::size_t>(comm.size()) * count_words_, card.memory(),
                      card.stream()),
        host_counts_(static_cast<std::size_t>(comm.size()) * count_words_),
        recv_keys_(0, card.memory(), card.stream()),
        recv_rows_(0, card.memory(), card.stream()),
        recv_records_(0, card.memory(), card.stream()),
        send_records_(0, card.memory(), card.stream()),
        merged_records_(0, card.memory(), card.stream()),
        merged_rows_(0, card.memory(), card.stream()),
        gathered_keys_(0, card.memory(), card.stream()),
        gathered_records_(0, card.memory(), card.stream()),
        send_slots_(0, card.memory(), card.stream()),
        recv_slots_(0, card.memory(), card.stream()),
        merged_slots_(0, card.memory(), card.stream()),
        gathered_slots_(0, card.memory(), card.stream()),
        host_probe_(2),
        check_words_(kCheckHead + (replicated_ ? 1 : static_cast<std::size_t>(comm.size())),
                     card.memory(), card.stream()),
        checks_(card, kCheckDepth, check_words_.size()) {
    GPUBOX_EXPECTS(&store.card() == &card, "HeterComm: the store belongs to card ",
                   store.card().rank(), ", not to card ", card.rank());
  }

  // Host waits: unplanned, the key counts (S1) and the owner's lookups (S2); planned, none.
  // Returns with the records enqueued.
  void pull(const uint64_t* keys, const int32_t* slots, std::size_t n, float* out_pull,
            const device::Stream& stream) {
    pulled_ = false;
    last_check_ = nullptr;  // set again by a planned pull
    begin_step();
    last_.pull_calls = 1;
    const std::size_t dim = static_cast<std::size_t>(layout_.pull_dim());
    const std::size_t unique = plan_keys(keys, n, slots != nullptr, stream);  // S1 (unplanned)
    const std::size_t received = recv_offsets_[total_cards_];
    reserve_exchange(unique, received);
    const bool with_slots = send_slots(slots, unique, received, stream);
    send_keys(stream);

    // Owner: the rows of the keys this card received, and the merge plan of their pushes (used
    // by push_pulled).
    recv_rows_.resize_discard(received);
    if (step_planned_) {
      guarded([&] { look_up_on_card(received, stream); });  // a failure forgets pending checks
    } else {
      // One wait for both counts.
      store_->lookup_async(recv_keys_.data(), received, recv_rows_.data(), stream);
      plan_owner_merge_async(received, stream);
      comm_->synchronize(stream, "HeterComm::pull owner lookups");  // S2
      merged_ = collect_owner_merge(received);
      merged_on_card_ = nullptr;
      const std::size_t missing = store_->misses();
      if (missing > 0) {
        last_.created_on_pull = resolve_missing(recv_keys_.data(), received, recv_rows_.data(),
                                                nullptr, with_slots, missing, stream);
      }
    }
    last_.owner_lookups += received;
    send_records_.resize_discard(unique * dim);
    if (replicated_) {
      // This card's own block of the received keys is its batch's unique keys in send order:
      // their records come from its replica, nothing travels back.
      device::parallel_for(
          stream, unique * dim,
          FillPullRecords{store_->ref(), recv_rows_.data() + recv_offsets_[comm_->rank()], unique,
                          send_records_.data(), static_cast<int32_t>(dim)});
    } else {
      recv_records_.resize_discard(received * dim);
      device::parallel_for(stream, received * dim,
                           FillPullRecords{store_->ref(), recv_rows_.data(), received,
                                           recv_records_.data(), static_cast<int32_t>(dim)});
      // Records travel back along the keys' route, reversed.
      for (int c = 0; c < total_cards_; ++c) {
        send_scaled_[c] = recv_counts_[c] * dim;
        recv_scaled_[c] = send_counts_[c] * dim;
      }
      comm_->all_to_all_v(recv_records_.data(), send_scaled_.data(), send_records_.data(),
                          recv_scaled_.data(), stream);
      count_bytes(send_scaled_.data(), sizeof(float));
    }
    device::parallel_for(stream, n * dim,
                         ScatterRecords{send_records_.data(), local_.occurrence_unique(), out_pull,
                                        static_cast<int32_t>(dim)});
    finish_step();
    pulled_ = true;
  }

  void push(const uint64_t* keys, const int32_t* slots, std::size_t n, const float* grads,
            const device::Stream& stream) {
    pulled_ = false;  // the plan and the received keys are about to describe another batch
    begin_step();
    last_.push_calls = 1;
    const std::size_t unique = plan_keys(keys, n, slots != nullptr, stream);  // S1
    const std::size_t received = recv_offsets_[total_cards_];
    reserve_exchange(unique, received);
    reduce_local(grads, unique, stream);
    const bool with_slots = send_slots(slots, unique, received, stream);
    send_keys(stream);
    send_records(received, stream);
    plan_owner_merge_async(received, stream);
    comm_->synchronize(stream, "HeterComm::push merge");  // S2
    merged_on_card_ = nullptr;
    const std::size_t merged = collect_owner_merge(received);
    merge_records(merged, stream);
    merged_rows_.resize_discard(merged);
    store_->lookup_async(owner_merge_.unique_keys(), merged, merged_rows_.data(), stream);
    stream.synchronize();  // no collective in flight since S2
    const std::size_t missing = store_->misses();
    if (missing > 0) {
      last_.created_on_push =
          resolve_missing(owner_merge_.unique_keys(), merged, merged_rows_.data(), &owner_merge_,
                          with_slots, missing, stream);
    }
    last_.owner_lookups += merged;
    apply_updates(merged, /*veto=*/nullptr, stream);
    stream.synchronize();
    finish_step();
  }

  void push_pulled(const float* grads, const uint32_t* veto, const device::Stream& stream) {
    GPUBOX_EXPECTS(pulled_, "HeterComm::push_pulled on card ", comm_->rank(),
                   " without a pull before it (or after a push, which replaced the pulled keys)");
    begin_step();
    last_.push_calls = 1;
    last_.keys_in = local_.occurrences();
    const std::size_t unique = local_.unique_count();
    reduce_local(grads, unique, stream);
    send_records(recv_keys_.size(), stream);
    // The pull planned the merge of the received keys and found (or created) every key's row:
    // the first occurrence of each merged key names it. No dedup, no hash lookup.
    // A planned step's merge count is on the card: merged_ is its bound (the received keys).
    merge_records(merged_, stream);
    merged_rows_.resize_discard(merged_);
    device::parallel_for(stream, merged_,
                         GatherMerged<row_index_t>{
                             recv_rows_.data(), owner_merge_.sorted_positions(),
                             owner_merge_.unique_start(), merged_rows_.data(), merged_on_card_});
    apply_updates(merged_, veto, stream);
    if (last_check_ != nullptr) last_check_->pushed = true;
    // An unplanned step (it waited for its counts anyway) ends with a wait, S3, so that its
    // caller may allocate after it (device rule 1: the step's collectives are done). A planned
    // step returns with its work enqueued: its caller sized everything before the pass.
    if (!step_planned_) comm_->synchronize(stream, "HeterComm::push_pulled");
    finish_step();
  }

  // Retires every pending check of a planned step (waits for the card only where one's copy has
  // not completed); throws the first failure, naming its pass and step.
  void drain_checks() {
    guarded([&] { checks_.drain(RetireCheck{this}); });
  }

  const table::RowLayout& layout() const { return layout_; }
  int rank() const { return comm_->rank(); }
  int total_cards() const { return total_cards_; }
  const HeterCommStats& stats() const { return stats_; }
  const HeterCommStats& last_step() const { return last_; }

 private:
  // Device rule 1: every buffer the rest of the step needs (this pull or push, and the
  // push_pulled after a pull), sized before the first collective that moves keys.
  void reserve_exchange(std::size_t unique, std::size_t received) {
    // Sized with headroom when they must grow (a step past reserve_steps' bounds, or none were
    // given): how a batch's keys split between the owners varies from step to step, and sized
    // to the exact count of the first steps, a later step that receives a few more keys grew
    // every exchange buffer at once (~13 allocations in one step). The buffers' growth factor.
    if (received > exchange_received_) exchange_received_ = received + received / 2;
    if (unique > exchange_unique_) exchange_unique_ = unique + unique / 2;
    // The blocks are padded to the step's largest unique count: headroom as above.
    if (replicated_ && max_unique_ > exchange_max_unique_) {
      exchange_max_unique_ = max_unique_ + max_unique_ / 2;
    }
    grow_exchange(local_.occurrences());
    const std::size_t record_dim =
        static_cast<std::size_t>(std::max(layout_.pull_dim(), layout_.push_dim()));
    const std::size_t push_dim = static_cast<std::size_t>(layout_.push_dim());
    // This step's sizes (within the capacity grow_exchange gave).
    recv_keys_.resize_discard(received);
    recv_rows_.resize_discard(received);
    recv_records_.resize_discard(received * record_dim);
    send_records_.resize_discard(unique * record_dim);
    merged_records_.resize_discard(received * push_dim);
    merged_rows_.resize_discard(received);
    if (replicated_) {
      const std::size_t blocks = static_cast<std::size_t>(total_cards_) * max_unique_;
      gathered_keys_.resize_discard(blocks);
      gathered_records_.resize_discard(blocks * push_dim);
    }
  }

  // Grows every exchange buffer, the owner merge, the lookups' and reductions' scratch to what
  // exchange_received_, exchange_unique_ and exchange_max_unique_ (and `occurrences` local keys)
  // need; sizes (and contents) as the growth leaves them.
  void grow_exchange(std::size_t occurrences) {
    const std::size_t rows = exchange_received_;
    const std::size_t record_dim =
        static_cast<std::size_t>(std::max(layout_.pull_dim(), layout_.push_dim()));
    const std::size_t push_dim = static_cast<std::size_t>(layout_.push_dim());
    grow(recv_keys_, rows);
    grow(recv_rows_, rows);
    grow(recv_records_, rows * record_dim);
    grow(send_records_, exchange_unique_ * record_dim);
    grow(merged_records_, rows * push_dim);
    grow(merged_rows_, rows);
    owner_merge_.reserve(rows, /*sorting=*/total_cards_ > 1);  // 1 card: run_unique_sorted
    store_->reserve_lookups(rows);
    reducer_.reserve(std::max(occurrences, rows), layout_.push_dim());
    if (replicated_) {
      const std::size_t room = static_cast<std::size_t>(total_cards_) * exchange_max_unique_;
      grow(gathered_keys_, room);
      grow(gathered_records_, room * push_dim);
    }
  }
  // Capacity for `count` elements, contents not kept.
  template <class T>
  static void grow(device::device_buffer<T>& buffer, std::size_t count) {
    if (count > buffer.capacity()) buffer.resize_discard(count);
  }

 public:
  void plan_next_step(const uint64_t* counts) { planned_ = counts; }

  void reserve_steps(const StepBounds& bounds) {
    pulled_ = false;  // the received keys' buffers may be replaced
    exchange_received_ = std::max(exchange_received_, bounds.received);
    exchange_unique_ = std::max(exchange_unique_, bounds.unique);
    exchange_max_unique_ = std::max(exchange_max_unique_, bounds.block);
    // The local dedup and owner plan run over the batch's occurrences (the unique count is
    // known on the card only); its sort's and scan's temporaries are its own, sized here.
    local_.reserve(bounds.occurrences);
    grow_exchange(bounds.occurrences);
  }

 private:
  // One summed push record per unique key of the planned batch, written in send order.
  void reduce_local(const float* grads, std::size_t unique, const device::Stream& stream) {
    const int32_t dim = layout_.push_dim();
    send_records_.resize_discard(unique * static_cast<std::size_t>(dim));
    reducer_.run(local_.unique_start(), unique, local_.occurrences(), dim,
                 OrderedRecords<float>{grads, local_.sorted_positions(), dim},
                 RecordRows<float>{send_records_.data(), nullptr, dim}, stream);
  }

  // Sends the summed records to the owners, along the keys' route.
  void send_records(std::size_t received, const device::Stream& stream) {
    const std::size_t dim = static_cast<std::size_t>(layout_.push_dim());
    for (int c = 0; c < total_cards_; ++c) {
      send_scaled_[c] = send_counts_[c] * dim;
      recv_scaled_[c] = recv_counts_[c] * dim;
    }
    recv_records_.resize_discard(received * dim);
    if (replicated_) {
      gather_blocks(gathered_records_, send_records_.data(), dim, recv_records_.data(), stream);
      return;
    }
    comm_->all_to_all_v(send_records_.data(), send_scaled_.data(), recv_records_.data(),
                        recv_scaled_.data(), stream);
    count_bytes(send_scaled_.data(), sizeof(float));
  }

  // Replicated placement's exchange: every card's `mine` (its unique count of records of `dim`
  // elements, in send order) lands in `out` on every card, grouped by source card in rank order
  // (the layout the owner receives with all_to_all_v). The blocks are padded to the largest
  // unique count so that one all_gather moves them (in place in `gathered`, sized by
  // reserve_exchange), then packed; `mine` needs no padding.
  template <class T>
  void gather_blocks(device::device_buffer<T>& gathered, const T* mine, std::size_t dim, T* out,
                     const device::Stream& stream) {
    const std::size_t block = max_unique_ * dim;
    const int me = comm_->rank();
    T* own = gathered.data() + static_cast<std::size_t>(me) * block;
    device::copy_async(own, mine, recv_counts_[me] * dim, stream);
    comm_->all_gather(own, gathered.data(), block, stream);
    for (int c = 0; c < total_cards_; ++c) {
      device::copy_async(out + recv_offsets_[c] * dim,
                         gathered.data() + static_cast<std::size_t>(c) * block,
                         recv_counts_[c] * dim, stream);
      send_scaled_[c] = block;  // what this card's block costs each peer
    }
    count_bytes(send_scaled_.data(), sizeof(T));
  }

  // Merges, on the owner, the records of one key from every source card (summed in source-rank
  // order), following the owner merge plan of `merged` distinct keys.
  void merge_records(std::size_t merged, const device::Stream& stream) {
    const std::size_t dim = static_cast<std::size_t>(layout_.push_dim());
    merged_records_.resize_discard(merged * dim);
    const int32_t fields = layout_.push_dim();
    reducer_.run(
        owner_merge_.unique_start(), merged, recv_keys_.size(), fields,
        OrderedRecords<float>{recv_records_.data(), owner_merge_.sorted_positions(), fields},
        RecordRows<float>{merged_records_.data(), nullptr, fields}, stream);
  }

  // The merge plan of the `received` keys (distinct keys and their occurrences), enqueued; its
  // count is read by collect_owner_merge after the caller's next wait. A single card receives
  // only its own unique, ascending keys: nothing to merge, nothing to wait for.
  void plan_owner_merge_async(std::size_t received, const device::Stream& stream) {
    if (total_cards_ == 1) {
      owner_merge_.run_unique_sorted(recv_keys_.data(), received, stream);
      return;
    }
    owner_merge_.run_async(recv_keys_.data(), received, stream);
    owner_merge_.copy_count_async(stream);
  }
  std::size_t collect_owner_merge(std::size_t received) {
    return total_cards_ == 1 ? received : owner_merge_.collect_count();
  }

  // One optimizer step per merged key (merged_rows_ holds their rows), rows marked dirty; none
  // when `veto` (card memory) does not hold kNoVeto.
  // `merged` is a bound when merged_on_card_ is set (a planned step): its count is added to
  // stats() when the step's check retires.
  void apply_updates(std::size_t merged, const uint32_t* veto, const device::Stream& stream) {
    device::parallel_for(
        stream, merged,
        ApplyUpdates{store_->ref(), merged_rows_.data(), owner_merge_.unique_keys(),
                     merged_records_.data(), config_, veto, merged, merged_on_card_});
    last_.merged_updates = merged_on_card_ != nullptr ? 0 : merged;
  }

  // A planned step's owner side without a wait: the lookups and the merge plan stay on the card
  // (merged_ = the received count, a bound; merged_on_card_ = the count), and the step's check
  // (misses, merge count, the card's own count row against the plan) is copied into the late
  // checks' next slot, read kCheckDepth steps later or by drain_checks.
  void look_up_on_card(std::size_t received, const device::Stream& stream) {
    store_->lookup_on_card(recv_keys_.data(), received, recv_rows_.data(), stream);
    merged_ = received;
    merged_on_card_ = nullptr;
    if (total_cards_ == 1) {
      // A single card receives its own unique, ascending keys: nothing to merge.
      owner_merge_.run_unique_sorted(recv_keys_.data(), received, stream);
    } else {
      owner_merge_.run_async(recv_keys_.data(), received, stream, /*pad=*/true);
      merged_on_card_ = owner_merge_.count_on_card();  // null when nothing was received
    }
    const std::size_t row_size = replicated_ ? 1 : static_cast<std::size_t>(total_cards_);
    const std::size_t me = static_cast<std::size_t>(comm_->rank());
    const auto slot = checks_.begin(RetireCheck{this});
    device::parallel_for(
        stream, 1,
        WriteStepCheck{store_->miss_count_on_card(), recv_rows_.data(), recv_keys_.data(), received,
                       merged_on_card_, local_.owner_begin(), row_size, check_words_.data()});
    device::copy_async(slot.host, check_words_.data(), check_words_.size(), stream);
    StepCheck& tag = *slot.tag;
    tag.pass = comm_->pass();
    tag.step = comm_->step();
    const uint64_t* planned = host_counts_.data() + me * count_words_;
    tag.planned_row.assign(planned, planned + row_size);
    tag.recv_offsets.assign(recv_offsets_.begin(), recv_offsets_.end());
    tag.pushed = false;
    tag.merge_late = merged_on_card_ != nullptr;
    checks_.commit(stream);
    last_check_ = &tag;
  }

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
  void retire_check(const StepCheck& tag, const uint64_t* words) {
    if (&tag == last_check_) last_check_ = nullptr;
    if (tag.pushed && tag.merge_late) stats_.merged_updates += words[3];
    const std::string at =
        tag.pass >= 0 ? ::gpubox::detail::concat("pass ", tag.pass, ", step ", tag.step, ": ")
                      : std::string();
    for (std::size_t c = 0; c < tag.planned_row.size(); ++c) {
      const uint64_t actual = words[kCheckHead + c];
      GPUBOX_EXPECTS(actual == tag.planned_row[c], at, "HeterComm on card ", comm_->rank(),
                     ": this step's batch has ", actual, " distinct keys for ",
                     replicated_ ? std::string("every card") : "card " + std::to_string(c),
                     " where the pass's step plan said ", tag.planned_row[c],
                     " (the plan does not describe the batch; checked ", kCheckDepth,
                     " steps late at most)");
    }
    if (words[0] == 0) return;
    const auto source = std::upper_bound(tag.recv_offsets.begin(), tag.recv_offsets.end(),
                                         static_cast<std::size_t>(words[1])) -
                        tag.recv_offsets.begin() - 1;
    GPUBOX_FAIL(
        at, "HeterComm pull: key ", words[2],
        replicated_ ? " is missing on the replica of card " : " is missing on its owner card ",
        comm_->rank(), " (requested by card ", source, "; ", words[0],
        " keys missing in the step; missing_keys = fail); this step's key counts came "
        "from the pass's step plan: where the plan does not describe a card's batch, keys "
        "reach the wrong owner");
  }

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
                        const device::Stream& stream) {
    last_.keys_in = n;
    const std::size_t cards = static_cast<std::size_t>(total_cards_);
    const std::size_t me = static_cast<std::size_t>(comm_->rank());
    // Sharded: row r = what card r sends each card. Replicated: row r (one entry) = card r's
    // unique count, which it sends to every card. Then kCreate's slots flag.
    const std::size_t row_size = replicated_ ? 1 : cards;
    // One sort by (owner, key): the unique keys come out in send order, each owner's first
    // index on the card (local_.owner_begin; a planned step's check reads its counts there).
    local_.run_async(keys, n, stream);
    uint64_t* my_row = count_matrix_.data() + me * count_words_;
    const uint64_t* planned = std::exchange(planned_, nullptr);
    step_planned_ = false;
    if (planned != nullptr && count_words_ == row_size) {
      // Every card's counts of this step come from the pass's plan: no all-gather, no wait. The
      // card's own row is checked against it late (the step's StepCheck).
      std::copy(planned, planned + cards * row_size, host_counts_.data());
      step_planned_ = true;
    } else {
      local_.write_counts_async(my_row, stream);
      if (count_words_ > row_size) {
        device::parallel_for(stream, 1, WriteWord{my_row + row_size, sends_slots ? 1u : 0u});
      }
      comm_->all_gather(my_row, count_matrix_.data(), count_words_, stream);  // in place
      device::copy_async(host_counts_.data(), count_matrix_.data(), cards * count_words_, stream);
      comm_->synchronize(stream, "HeterComm key counts");  // S1
      if (count_words_ > row_size) check_slots_agree(row_size);
    }
    const uint64_t* row = host_counts_.data() + me * count_words_;
    for (std::size_t c = 0; c < row_size; ++c) send_counts_[c] = row[c];
    std::size_t unique = 0;
    for (std::size_t c = 0; c < row_size; ++c) unique += row[c];
    max_unique_ = 0;
    for (std::size_t c = 0; c < cards; ++c) {
      recv_counts_[c] =
          replicated_ ? host_counts_[c * count_words_] : host_counts_[c * count_words_ + me];
      recv_offsets_[c + 1] = recv_offsets_[c] + recv_counts_[c];
      max_unique_ = std::max<std::size_t>(max_unique_, recv_counts_[c]);
    }
    local_.set_count(unique);
    last_.unique_keys_sent = unique;
    return unique;
  }

  // plan_keys's agreement (kCreate): the slots flag after each card's `row_size` counts. A
  // mismatch fails every card with the same message, naming the cards on each side.
  void check_slots_agree(std::size_t row_size) const {
    std::string with, without;
    for (int c = 0; c < total_cards_; ++c) {
      std::string& side =
          host_counts_[static_cast<std::size_t>(c) * count_words_ + row_size] != 0 ? with : without;
      side += (side.empty() ? "" : ",") + std::to_string(c);
    }
    GPUBOX_EXPECTS(with.empty() || without.empty(), "HeterComm (missing_keys = create): cards ",
                   with, " passed the keys' slots and cards ", without,
                   " did not, in the same step: every card passes slots or none does");
  }

  // With MissingKeyPolicy::kCreate and the occurrences' slots: sends each planned unique key's
  // slot to its owner along with the key (recv_slots_, in recv_keys_'s order), so that a missing
  // key is created at its slot's width. One more collective; the trainer (kFail) never sends
  // them. Sizes its buffers first (the step's collectives have not started). Returns whether it
  // sent them.
  bool send_slots(const int32_t* slots, std::size_t unique, std::size_t received,
                  const device::Stream& stream) {
    if (slots == nullptr || options_.missing_keys != MissingKeyPolicy::kCreate) return false;
    send_slots_.resize_discard(unique);
    recv_slots_.resize_discard(received);
    if (replicated_) {
      gathered_slots_.resize_discard(static_cast<std::size_t>(total_cards_) * max_unique_);
    }
    device::parallel_for(stream, unique,
                         SendOrderSlots{slots, local_.sorted_positions(), local_.unique_start(),
                                        send_slots_.data()});
    if (replicated_) {
      gather_blocks(gathered_slots_, send_slots_.data(), 1, recv_slots_.data(), stream);
    } else {
      comm_->all_to_all_v(send_slots_.data(), send_counts_.data(), recv_slots_.data(),
                          recv_counts_.data(), stream);
      count_bytes(send_counts_.data(), sizeof(int32_t));
    }
    return true;
  }

  // Sends the planned unique keys to their owners; recv_keys_ (sized by reserve_exchange) gets
  // the keys this card owns, grouped by source card.
  void send_keys(const device::Stream& stream) {
    if (replicated_) {
      gather_blocks(gathered_keys_, local_.unique_keys(), 1, recv_keys_.data(), stream);
      return;
    }
    comm_->all_to_all_v(local_.unique_keys(), send_counts_.data(), recv_keys_.data(),
                        recv_counts_.data(), stream);
    count_bytes(send_counts_.data(), sizeof(uint64_t));
  }

  void count_bytes(const std::size_t* send_counts, std::size_t element_bytes) {
    for (int c = 0; c < total_cards_; ++c) {
      const uint64_t bytes = send_counts[c] * element_bytes;
      last_.bytes_sent += bytes;
      if (c != comm_->rank()) last_.bytes_sent_remote += bytes;
    }
  }

  // The `missing` keys among keys[0, n) that the lookup did not find (rows[i] == kInvalidRow):
  // created (rows filled in, count returned) or a failure, as the options say. `merge` (push)
  // maps a merged key back to a received position, to name the requesting card; null when keys
  // are the received keys themselves. `with_slots`: recv_slots_ holds the received keys' slots
  // (send_slots), so created rows take their slot's width; else slot 0's. Runs after a wait: it
  // may allocate and synchronize.
  std::size_t resolve_missing(const uint64_t* keys, std::size_t n, row_index_t* rows,
                              const detail::KeyDedup* merge, bool with_slots, std::size_t missing,
                              const device::Stream& stream) {
    if (options_.missing_keys == MissingKeyPolicy::kCreate) {
      const int32_t* key_slots = with_slots ? recv_slots_.data() : nullptr;
      if (with_slots && merge != nullptr) {
        merged_slots_.resize_discard(n);
        device::parallel_for(
            stream, n,
            GatherMerged<int32_t>{recv_slots_.data(), merge->sorted_positions(),
                                  merge->unique_start(), merged_slots_.data(), nullptr});
        key_slots = merged_slots_.data();
      }
      return store_->create_missing_rows(keys, key_slots, n, rows, missing, stream);
    }
    const row_index_t* first_missing = rows + n;
    detail::with_policy(stream, scratch_, n, [&](const auto& policy) {
      first_missing = device::host_result(
          stream, [&] { return thrust::find(policy, rows, rows + n, card_table::kInvalidRow); });
    });
    GPUBOX_EXPECTS(first_missing != rows + n, "HeterComm: ", missing,
                   " keys reported missing, none found");
    const std::size_t index = static_cast<std::size_t>(first_missing - rows);
    uint64_t key = 0;
    device::copy_async(&key, keys + index, 1, stream);  // the error path: pageable is fine
    position_t received_at = static_cast<position_t>(index);
    if (merge != nullptr) {
      device::copy_async(host_probe_.data(), merge->unique_start() + index, 1, stream);
      stream.synchronize();
      device::copy_async(&received_at, merge->sorted_positions() + host_probe_[0], 1, stream);
    }
    stream.synchronize();
    const auto source = std::upper_bound(recv_offsets_.begin(), recv_offsets_.end(),
                                         static_cast<std::size_t>(received_at)) -
                        recv_offsets_.begin() - 1;
    GPUBOX_FAIL(
        "HeterComm ", merge != nullptr ? "push" : "pull", ": key ", key,
        replicated_ ? " is missing on the replica of card " : " is missing on its owner card ",
        comm_->rank(), " (requested by card ", source, "; missing_keys = fail)",
        step_planned_ ? "; this step's key counts came from the pass's step plan: where the plan "
                        "does not describe a card's batch, keys reach the wrong owner"
                      : "");
  }

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

  HeterCommStats stats_;
  HeterCommStats last_;
  // The plan, received keys, their rows and the owner merge describe the last pull
  // (push_pulled reuses them); merged_ is that merge's count of distinct keys.
  bool pulled_ = false;
  std::size_t merged_ = 0;
  std::size_t scratch_before_ = 0;
};

HeterComm::HeterComm(device::Card& card, card_table::CardSparseStore& store,
                     comm::Communicator& comm, const HeterCommOptions& options)
    : impl_(std::make_unique<Impl>(card, store, comm, options)) {}
HeterComm::~HeterComm() = default;
HeterComm::HeterComm(HeterComm&&) noexcept = default;
HeterComm& HeterComm::operator=(HeterComm&&) noexcept = default;

void HeterComm::pull(const uint64_t* keys, std::size_t n, float* out_pull,
                     const device::Stream& stream, const int32_t* slots) {
  impl_->pull(keys, slots, n, out_pull, stream);
}
void HeterComm::push(const uint64_t* keys, std::size_t n, const float* grads,
                     const device::Stream& stream, const int32_t* slots) {
  impl_->push(keys, slots, n, grads, stream);
}
void HeterComm::reserve_steps(const StepBounds& bounds) { impl_->reserve_steps(bounds); }
void HeterComm::plan_next_step(const uint64_t* counts) { impl_->plan_next_step(counts); }
void HeterComm::drain_checks() { impl_->drain_checks(); }
void HeterComm::push_pulled(const float* grads, const device::Stream& stream,
                            const uint32_t* veto) {
  impl_->push_pulled(grads, veto, stream);
}
const table::RowLayout& HeterComm::layout() const { return impl_->layout(); }
int HeterComm::rank() const { return impl_->rank(); }
int HeterComm::total_cards() const { return impl_->total_cards(); }
const HeterCommStats& HeterComm::stats() const { return impl_->stats(); }
const HeterCommStats& HeterComm::last_step() const { return impl_->last_step(); }

}  // namespace gpubox::heter_comm
