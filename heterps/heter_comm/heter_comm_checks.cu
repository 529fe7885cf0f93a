// HeterComm's checks (see heter_comm.hpp and detail/heter_comm_impl.cuh): a planned step's owner
// lookups with its check written on the card and retired a few steps late through the ring of
// pinned slots, and an unplanned step's missing keys, created or reported naming the key and the
// requesting card.
#include <thrust/find.h>

#include "heterps/heter_comm/detail/heter_comm_impl.cuh"

namespace gpubox::heter_comm {
namespace {

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

}  // namespace

void HeterComm::Impl::drain_checks() {
  guarded([&] { checks_.drain(RetireCheck{this}); });
}

void HeterComm::Impl::look_up_on_card(std::size_t received, const device::Stream& stream) {
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
  checks_.copy_on_card(stream, {{check_words_.data(), 0, check_words_.bytes()}});
  StepCheck& tag = *slot.tag;
  tag.pass = comm_->pass();
  tag.step = comm_->step();
  const uint64_t* planned = host_counts_.data() + me * count_words_;
  tag.planned_row.assign(planned, planned + row_size);
  tag.recv_offsets.assign(recv_offsets_.begin(), recv_offsets_.end());
  tag.pushed = false;
  tag.merge_late = merged_on_card_ != nullptr;
  tag.block = 0;
  checks_.commit(stream);
  last_check_ = &tag;
}

void HeterComm::Impl::retire_check(const StepCheck& tag, const uint64_t* words) {
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
  // A padded step's received keys sit in blocks of tag.block per source card.
  const auto source = tag.block > 0
                          ? static_cast<std::ptrdiff_t>(words[1] / tag.block)
                          : std::upper_bound(tag.recv_offsets.begin(), tag.recv_offsets.end(),
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

std::size_t HeterComm::Impl::resolve_missing(const uint64_t* keys, std::size_t n, row_index_t* rows,
                                             const detail::KeyDedup* merge, bool with_slots,
                                             std::size_t missing, const device::Stream& stream) {
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

}  // namespace gpubox::heter_comm
