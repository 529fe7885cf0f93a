// HeterComm's key plan and buffer sizes (see heter_comm.hpp and detail/heter_comm_impl.cuh): the
// local dedup and owner plan of a batch (one (owner, key) sort), its counts from the pass's plan
// or all-gathered (S1), and every exchange buffer sized before the keys move (device rule 1).
#include "heterps/heter_comm/detail/heter_comm_impl.cuh"

namespace gpubox::heter_comm {
namespace {

// *word = value, on the card (a flag next to the counts that S1 all-gathers).
struct WriteWord {
  uint64_t* word;
  uint64_t value;
  GPUBOX_HD void operator()(std::size_t) const { *word = value; }
};

}  // namespace

void HeterComm::Impl::reserve_exchange(std::size_t unique, std::size_t received) {
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

void HeterComm::Impl::grow_exchange(std::size_t occurrences) {
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
  grow(clip_partials_, device::reduce_partials(rows));       // clip_merged's, over the merged keys
  owner_merge_.reserve(rows, /*sorting=*/total_cards_ > 1);  // 1 card: run_unique_sorted
  store_->reserve_lookups(rows);
  reducer_.reserve(std::max(occurrences, rows), layout_.push_dim());
  scratch_.reserve(kScratchHeadroom);  // the card's other Thrust users (heter_comm.hpp)
  if (replicated_) {
    const std::size_t room = static_cast<std::size_t>(total_cards_) * exchange_max_unique_;
    grow(gathered_keys_, room);
    grow(gathered_records_, room * push_dim);
  }
}

void HeterComm::Impl::reserve_steps(const StepBounds& bounds) {
  pulled_ = false;  // the received keys' buffers may be replaced
  padded_pulled_ = false;
  // After a failed step: the checks' slot counter on the card back in step with the host's
  // before the pass's pulls (which may begin their slots inside a caller's capture).
  checks_.resync();
  // The local dedup and owner plan run over the batch's occurrences (the unique count is
  // known on the card only); its sort's and scan's temporaries are its own, sized here.
  local_.reserve(bounds.occurrences);
  if (pads(bounds)) {
    // Every step of the pass runs padded, in its own buffers: the unpadded exchange buffers
    // (sized by `received`: replicated, every card's distinct keys, with every card's blocks
    // besides) would be held for nothing. The card's other Thrust users still get their arena.
    scratch_.reserve(kScratchHeadroom);
    reserve_padded(bounds);
    return;
  }
  exchange_received_ = std::max(exchange_received_, bounds.received);
  exchange_unique_ = std::max(exchange_unique_, bounds.unique);
  exchange_max_unique_ = std::max(exchange_max_unique_, bounds.block);
  grow_exchange(bounds.occurrences);
  reserve_padded(bounds);  // no padded steps: their sizes are cleared
}

void HeterComm::Impl::plan_next_step(const PlannedCounts& counts, const uint64_t* n_on_card) {
  if (counts.counts != nullptr) {
    // padded_counts and plan_keys read total_cards rows of this width: a plan made for the other
    // placement would be read past its end (sharded on a replicated card) or misread.
    const std::size_t row = replicated_ ? 1 : static_cast<std::size_t>(total_cards_);
    GPUBOX_EXPECTS(counts.row == row, "HeterComm on card ", comm_->rank(), ": a step plan of ",
                   counts.row, " counts per card, but the ",
                   replicated_
                       ? "replicated placement (Collective mode) takes 1 (its distinct keys)"
                       : "sharded placement takes one per owner card (",
                   replicated_ ? "" : std::to_string(total_cards_) + ")",
                   ": the pass's plan was made for the other placement");
  }
  // A padded pass sized only its fixed blocks (reserve_steps skipped the unpadded buffers): a
  // planned step without its occurrence count would run unpadded, grow those buffers with no
  // wait while the previous step's collectives may run (device rule 1), so it is refused.
  GPUBOX_EXPECTS(counts.counts == nullptr || n_on_card != nullptr || !padded_.enabled(),
                 "HeterComm on card ", comm_->rank(),
                 ": a planned step of a padded pass needs its occurrence count (n_on_card): "
                 "without it the step would run unpadded in buffers the pass did not size");
  planned_ = counts.counts;
  planned_n_ = n_on_card;
  // A padded pull may run inside a caller's capture (device::ComposedStep), where its check's
  // slot cannot be had by reading the oldest one: read it now (it may throw that step's failure).
  if (n_on_card != nullptr && padded_.enabled()) {
    guarded([&] { checks_.make_room(RetireCheck{this}); });
  }
}

HeterCommMemory HeterComm::Impl::memory() const {
  const auto bytes = [](const auto&... buffers) {
    return ((buffers.capacity() * sizeof(*buffers.data())) + ...);
  };
  HeterCommMemory out;
  const PaddedSteps& p = padded_;
  out.padded = bytes(p.send_keys, p.recv_keys, p.keys, p.rows, p.recv_records, p.send_records,
                     p.merged_records, p.merged_rows, p.unique_slot);
  out.unpadded = bytes(recv_keys_, recv_rows_, recv_records_, send_records_, merged_records_,
                       merged_rows_, gathered_keys_, gathered_records_, send_slots_, recv_slots_,
                       merged_slots_, gathered_slots_);
  return out;
}

std::size_t HeterComm::Impl::plan_keys(const uint64_t* keys, std::size_t n, bool sends_slots,
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

void HeterComm::Impl::check_slots_agree(std::size_t row_size) const {
  std::string with, without;
  for (int c = 0; c < total_cards_; ++c) {
    std::string& side =
        host_counts_[static_cast<std::size_t>(c) * count_words_ + row_size] != 0 ? with : without;
    side += (side.empty() ? "" : ",") + std::to_string(c);
  }
  GPUBOX_EXPECTS(with.empty() || without.empty(), "HeterComm (missing_keys = create): cards ", with,
                 " passed the keys' slots and cards ", without,
                 " did not, in the same step: every card passes slots or none does");
}

}  // namespace gpubox::heter_comm
