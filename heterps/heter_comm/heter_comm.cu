// HeterComm's step engine (see heter_comm.hpp): the step itself, pull, push and push_pulled, with
// the exchanges, the merges and the update; the key plan is in heter_comm_plan.cu, the checks in
// heter_comm_checks.cu, the shared state in detail/heter_comm_impl.cuh. Portable device code:
// parallel_for functors and the device layer's sort and scan (CUB on CUDA) on the card's stream;
// the communicator moves the data.
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
#include <algorithm>
#include <cstdlib>
#include <string>

#include "heterps/heter_comm/detail/heter_comm_impl.cuh"
#include "heterps/heter_comm/detail/norm_clip.cuh"

namespace gpubox::heter_comm {
namespace {

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
#if !defined(GPUBOX_BACKEND_CUDA)
  // cpu: occurrence by occurrence, one division and one record look-up a row, its fields copied
  // together (the per-field form read the index again for every float).
  void run_range(std::size_t begin, std::size_t end) const {
    device::for_row_segments(begin, end, dim, [this](int64_t i, int64_t first, int64_t last) {
      const float* record =
          records + static_cast<std::size_t>(occurrence_unique[i]) * static_cast<std::size_t>(dim);
      std::copy(record + first, record + last, out + i * dim + first);
    });
  }
#endif
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

}  // namespace

HeterComm::Impl::Impl(device::Card& card, card_table::CardSparseStore& store,
                      comm::Communicator& comm, const HeterCommOptions& options)
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
      // A check's slot waits (only when the host runs kCheckDepth steps ahead) behind the step's
      // collectives: bounded by the group's timeout.
      checks_(card, kCheckDepth, check_words_.size(),
              comm::bounded_slot_wait<StepCheck>(comm, "the sparse check")),
      card_(&card),
      padded_(card),
      clip_partials_(0, card.memory(), card.stream()),
      clip_squares_(1, card.memory(), card.stream()),
      table_step_(table::optimizer::uses_table_step(config_) ? 1 : 0, card.memory(),
                  card.stream()) {
  GPUBOX_EXPECTS(&store.card() == &card, "HeterComm: the store belongs to card ",
                 store.card().rank(), ", not to card ", card.rank());
  if (table_step_.size() > 0) set_table_steps(0);
}

const table::optimizer::TableAdamStep* HeterComm::Impl::advance_table_step(
    const uint32_t* veto, const device::Stream& stream) {
  if (table_step_.size() == 0) return nullptr;
  device::parallel_for(stream, 1,
                       AdvanceTableStep{table_step_.data(), config_.optimizer.beta1_decay_rate,
                                        config_.optimizer.beta2_decay_rate, veto});
  return table_step_.data();
}

int64_t HeterComm::Impl::table_steps() const {
  if (table_step_.size() == 0) return 0;
  return device::to_host(table_step_.data(), 1, card_->stream())[0].steps;
}

void HeterComm::Impl::set_table_steps(int64_t steps) {
  if (table_step_.size() == 0) return;
  device::parallel_for(card_->stream(), 1, SetTableSteps{table_step_.data(), steps});
  card_->stream().synchronize();
}

void HeterComm::Impl::pull(const uint64_t* keys, const int32_t* slots, std::size_t n,
                           float* out_pull, const device::Stream& stream) {
  if (slots == nullptr && pull_is_padded(n)) {
    pull_padded(keys, n, out_pull, stream);
    return;
  }
  planned_n_ = nullptr;
  padded_pulled_ = false;
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

void HeterComm::Impl::push(const uint64_t* keys, const int32_t* slots, std::size_t n,
                           const float* grads, uint32_t* veto, NormClipState* clip,
                           const device::Stream& stream) {
  expect_veto_with_clip("push", veto, clip);
  pulled_ = false;  // the plan and the received keys are about to describe another batch
  padded_pulled_ = false;
  planned_n_ = nullptr;
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
    last_.created_on_push = resolve_missing(owner_merge_.unique_keys(), merged, merged_rows_.data(),
                                            &owner_merge_, with_slots, missing, stream);
  }
  last_.owner_lookups += merged;
  // The rows before this step, created ones included (their embedx part not yet made): as
  // push_pulled's after the pull that created them.
  if (clip != nullptr)
    clip_merged(merged_records_.data(), merged_rows_.data(), merged, clip, veto, stream);
  apply_updates(merged, veto, stream);
  // With a clip, sharded, the norm's all-reduce is in flight: a collective's wait (device rule 6),
  // so a card whose owner threw before it is named, not waited on forever.
  if (clip != nullptr) {
    comm_->synchronize(stream, "HeterComm::push");  // S3
  } else {
    stream.synchronize();
  }
  finish_step();
}

void HeterComm::Impl::push_pulled(const float* grads, uint32_t* veto, NormClipState* clip,
                                  const device::Stream& stream) {
  GPUBOX_EXPECTS(pulled_, "HeterComm::push_pulled on card ", comm_->rank(),
                 " without a pull before it (or after a push, which replaced the pulled keys, or a "
                 "pull_only, which planned no push)");
  expect_veto_with_clip("push_pulled", veto, clip);
  if (padded_pulled_) {
    push_padded(grads, veto, clip, stream);
    return;
  }
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
  device::parallel_for(
      stream, merged_,
      GatherMerged<row_index_t>{recv_rows_.data(), owner_merge_.sorted_positions(),
                                owner_merge_.unique_start(), merged_rows_.data(), merged_on_card_});
  if (clip != nullptr)
    clip_merged(merged_records_.data(), merged_rows_.data(), merged_, clip, veto, stream);
  apply_updates(merged_, veto, stream);
  if (last_check_ != nullptr) last_check_->pushed = true;
  // An unplanned step (it waited for its counts anyway) ends with a wait, S3, so that its
  // caller may allocate after it (device rule 1: the step's collectives are done). A planned
  // step returns with its work enqueued: its caller sized everything before the pass.
  if (!step_planned_) comm_->synchronize(stream, "HeterComm::push_pulled");
  finish_step();
}

void HeterComm::Impl::reduce_local(const float* grads, std::size_t unique,
                                   const device::Stream& stream) {
  const int32_t dim = layout_.push_dim();
  send_records_.resize_discard(unique * static_cast<std::size_t>(dim));
  reducer_.run(local_.unique_start(), unique, local_.occurrences(), dim,
               OrderedRecords<float>{grads, local_.sorted_positions(), dim},
               RecordRows<float>{send_records_.data(), nullptr, dim}, stream);
}

void HeterComm::Impl::send_records(std::size_t received, const device::Stream& stream) {
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

template <class T>
void HeterComm::Impl::gather_blocks(device::device_buffer<T>& gathered, const T* mine,
                                    std::size_t dim, T* out, const device::Stream& stream) {
  const std::size_t block = max_unique_ * dim;
  const int me = comm_->rank();
  T* own = gathered.data() + static_cast<std::size_t>(me) * block;
  device::copy_async(own, mine, recv_counts_[me] * dim, stream);
  comm_->all_gather(own, gathered.data(), block, stream);
  for (int c = 0; c < total_cards_; ++c) {
    device::copy_async(out + recv_offsets_[c] * dim,
                       gathered.data() + static_cast<std::size_t>(c) * block, recv_counts_[c] * dim,
                       stream);
    send_scaled_[c] = block;  // what this card's block costs each peer
  }
  count_bytes(send_scaled_.data(), sizeof(T));
}

void HeterComm::Impl::merge_records(std::size_t merged, const device::Stream& stream) {
  const std::size_t dim = static_cast<std::size_t>(layout_.push_dim());
  merged_records_.resize_discard(merged * dim);
  const int32_t fields = layout_.push_dim();
  reducer_.run(owner_merge_.unique_start(), merged, recv_keys_.size(), fields,
               OrderedRecords<float>{recv_records_.data(), owner_merge_.sorted_positions(), fields},
               RecordRows<float>{merged_records_.data(), nullptr, fields}, stream);
}

void HeterComm::Impl::plan_owner_merge_async(std::size_t received, const device::Stream& stream) {
  if (total_cards_ == 1) {
    owner_merge_.run_unique_sorted(recv_keys_.data(), received, stream);
    return;
  }
  owner_merge_.run_async(recv_keys_.data(), received, stream);
  owner_merge_.copy_count_async(stream);
}

std::size_t HeterComm::Impl::collect_owner_merge(std::size_t received) {
  return total_cards_ == 1 ? received : owner_merge_.collect_count();
}

void HeterComm::Impl::apply_updates(std::size_t merged, const uint32_t* veto,
                                    const device::Stream& stream) {
  const table::optimizer::TableAdamStep* table_step = advance_table_step(veto, stream);
  device::parallel_for(
      stream, merged,
      ApplyUpdates{store_->ref(), merged_rows_.data(), owner_merge_.unique_keys(),
                   merged_records_.data(), config_, veto, merged, merged_on_card_, table_step});
  last_.merged_updates = merged_on_card_ != nullptr ? 0 : merged;
}

void HeterComm::Impl::clip_merged(float* records, const row_index_t* rows, std::size_t merged,
                                  NormClipState* clip, uint32_t* veto,
                                  const device::Stream& stream) {
  const int32_t dim = layout_.push_dim();
  grow(clip_partials_, device::reduce_partials(merged));  // sized with the merge buffers
  device::reduce_into_then(stream, merged,
                           detail::MergedSquares<position_t>{store_->ref(), rows, records, dim,
                                                             merged_on_card_, merged, clip},
                           detail::SumDoubles{}, 0.0, clip_partials_.data(),
                           detail::StoreDouble{clip_squares_.data()});
  // Sharded, each owner summed its own keys; replicated, every card merged every key.
  if (!replicated_ && total_cards_ > 1) {
    comm_->all_reduce_sum(clip_squares_.data(), clip_squares_.data(), 1, stream);
  }
  device::parallel_for(stream, 1, detail::ClipFactor{clip, clip_squares_.data(), veto});
  device::parallel_for(
      stream, merged, detail::ScaleMerged<position_t>{records, dim, merged_on_card_, merged, clip});
}

void HeterComm::Impl::expect_veto_with_clip(const char* form, const uint32_t* veto,
                                            const NormClipState* clip) const {
  GPUBOX_EXPECTS(clip == nullptr || veto != nullptr, "HeterComm::", form, " on card ",
                 comm_->rank(),
                 ": clipping by global norm needs the step's veto word (a norm that is not finite "
                 "vetoes the step)");
}

bool HeterComm::Impl::send_slots(const int32_t* slots, std::size_t unique, std::size_t received,
                                 const device::Stream& stream) {
  if (slots == nullptr || options_.missing_keys != MissingKeyPolicy::kCreate) return false;
  send_slots_.resize_discard(unique);
  recv_slots_.resize_discard(received);
  if (replicated_) {
    gathered_slots_.resize_discard(static_cast<std::size_t>(total_cards_) * max_unique_);
  }
  device::parallel_for(
      stream, unique,
      SendOrderSlots{slots, local_.sorted_positions(), local_.unique_start(), send_slots_.data()});
  if (replicated_) {
    gather_blocks(gathered_slots_, send_slots_.data(), 1, recv_slots_.data(), stream);
  } else {
    comm_->all_to_all_v(send_slots_.data(), send_counts_.data(), recv_slots_.data(),
                        recv_counts_.data(), stream);
    count_bytes(send_counts_.data(), sizeof(int32_t));
  }
  return true;
}

void HeterComm::Impl::send_keys(const device::Stream& stream) {
  if (replicated_) {
    gather_blocks(gathered_keys_, local_.unique_keys(), 1, recv_keys_.data(), stream);
    return;
  }
  comm_->all_to_all_v(local_.unique_keys(), send_counts_.data(), recv_keys_.data(),
                      recv_counts_.data(), stream);
  count_bytes(send_counts_.data(), sizeof(uint64_t));
}

void HeterComm::Impl::count_bytes(const std::size_t* send_counts, std::size_t element_bytes) {
  for (int c = 0; c < total_cards_; ++c) {
    const uint64_t bytes = send_counts[c] * element_bytes;
    last_.bytes_sent += bytes;
    if (c != comm_->rank()) last_.bytes_sent_remote += bytes;
  }
}

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
void HeterComm::pull_only(const uint64_t* keys, std::size_t n, float* out_pull,
                          const device::Stream& stream) {
  impl_->pull_only(keys, n, out_pull, stream);
}
void HeterComm::push(const uint64_t* keys, std::size_t n, const float* grads,
                     const device::Stream& stream, const int32_t* slots, uint32_t* veto,
                     NormClipState* clip) {
  impl_->push(keys, slots, n, grads, veto, clip, stream);
}
void HeterComm::reserve_steps(const StepBounds& bounds) { impl_->reserve_steps(bounds); }
void HeterComm::plan_next_step(const PlannedCounts& counts, const uint64_t* n_on_card) {
  impl_->plan_next_step(counts, n_on_card);
}
HeterCommMemory HeterComm::memory() const { return impl_->memory(); }
bool HeterComm::pads_planned_steps() const { return impl_->pads_planned_steps(); }
void HeterComm::drain_checks() { impl_->drain_checks(); }
void HeterComm::push_pulled(const float* grads, const device::Stream& stream, uint32_t* veto,
                            NormClipState* clip) {
  impl_->push_pulled(grads, veto, clip, stream);
}
const table::RowLayout& HeterComm::layout() const { return impl_->layout(); }
int64_t HeterComm::table_steps() const { return impl_->table_steps(); }
void HeterComm::set_table_steps(int64_t steps) { impl_->set_table_steps(steps); }
int HeterComm::rank() const { return impl_->rank(); }
int HeterComm::total_cards() const { return impl_->total_cards(); }
const HeterCommStats& HeterComm::stats() const { return impl_->stats(); }
const HeterCommStats& HeterComm::last_step() const { return impl_->last_step(); }

// A test and debugging switch, not agreed between trainers: every process of a job must see the
// same value, since it decides the sizes of the step's collectives.
bool padded_steps_enabled() {
  const char* value = std::getenv("GPUBOX_PADDED_STEPS");
  return value == nullptr || std::string(value) != "0";
}
}  // namespace gpubox::heter_comm
