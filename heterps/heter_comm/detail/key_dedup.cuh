// Key deduplication and per-owner planning for one card's batch: the portable engine under
// HeterComm (Thrust on the card's stream plus parallel_for functors; no CUB, so the cpu build
// runs exactly this code).
//
//   KeyDedup      keys[n] -> unique keys (ascending), each occurrence's unique index, and each
//                 unique key's segment [start[u], start[u+1]) of occurrences in key order
//                 (stable: occurrences of one key stay in position order, so reductions over a
//                 segment sum in a fixed order and are reproducible run to run).
//   OwnerPlan     unique keys -> send order grouped by owner card (ascending key inside each
//                 owner), per-owner counts, unique index <-> send position.
//
// Both own their buffers and reuse them across calls (device_buffer::resize_discard): in steady
// state a step allocates nothing. Not thread-safe: one card thread drives them.
#pragma once

#include <thrust/binary_search.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/scan.h>
#include <thrust/sequence.h>
#include <thrust/sort.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/hash.hpp"
#include "common/macros.hpp"
#include "heterps/device/card.hpp"
#include "heterps/device/exec_policy.cuh"
#include "heterps/device/memory.hpp"
#include "heterps/device/parallel_for.cuh"
#include "heterps/heter_comm/detail/scratch_arena.hpp"

#if !defined(GPUBOX_BACKEND_CUDA)
#include <omp.h>
#include <thrust/system/cpp/execution_policy.h>
#endif

namespace gpubox::heter_comm::detail {

using position_t = uint32_t;

// Runs fn(policy) with the Thrust policy for `n` elements on the card's stream, temporaries
// from `scratch`. cpu backend: below kSerialThrustLimit elements, or with one thread per card,
// the card's own thread runs the algorithm (thrust::cpp): an OpenMP region costs more than it
// saves on a step-sized input, and its spin-waits cost far more on a loaded machine (the rule of
// parallel_for's kSerialLoopLimit, for Thrust calls).
inline constexpr std::size_t kSerialThrustLimit = std::size_t{1} << 16;

template <class Fn>
void with_policy(const device::Stream& stream, ScratchArena& scratch, std::size_t n, Fn&& fn) {
#if defined(GPUBOX_BACKEND_CUDA)
  (void)n;
  fn(device::exec_policy(stream, scratch));
#else
  if (n < kSerialThrustLimit || omp_get_max_threads() == 1) {
    device::count_thrust_call(stream);  // exec_policy counts the other path
    fn(thrust::cpp::par(scratch));
  } else {
    fn(device::exec_policy(stream, scratch));
  }
#endif
}

struct MarkSegmentHeads {
  const uint64_t* sorted_keys;
  position_t* heads;
  GPUBOX_HD void operator()(std::size_t i) const {
    heads[i] = (i == 0 || sorted_keys[i] != sorted_keys[i - 1]) ? 1u : 0u;
  }
};

// After the inclusive scan, seg_id[i] = 1 + unique index of sorted position i.
struct RecordSegments {
  const uint64_t* sorted_keys;
  const position_t* sorted_pos;
  const position_t* seg_id;
  uint64_t* unique_keys;
  position_t* unique_start;
  position_t* occurrence_unique;
  GPUBOX_HD void operator()(std::size_t i) const {
    const position_t u = seg_id[i] - 1;
    occurrence_unique[sorted_pos[i]] = u;
    if (i == 0 || sorted_keys[i] != sorted_keys[i - 1]) {
      unique_keys[u] = sorted_keys[i];
      unique_start[u] = static_cast<position_t>(i);
    }
  }
};

// unique_start[count] = n, with the unique count read on the card (seg_id of the last
// position), so run_async needs no host round trip.
struct StoreClosingOffset {
  position_t* unique_start;
  const position_t* last_seg_id;
  position_t n;
  GPUBOX_HD void operator()(std::size_t) const { unique_start[*last_seg_id] = n; }
};

// unique_start[u] = n for every u past the count on the card (u in (*count, n]): the segments
// past the last unique key are empty, so kernels launched over a bound of n segments (a count
// known only on the card) sum nothing there.
struct PadUniqueStarts {
  position_t* unique_start;
  const position_t* count;
  position_t n;
  GPUBOX_HD void operator()(std::size_t u) const {
    if (u > *count) unique_start[u] = n;
  }
};

class KeyDedup {
 public:
  // `scratch` (Thrust's temporaries) must outlive the KeyDedup.
  KeyDedup(device::Card& card, ScratchArena& scratch)
      : scratch_(&scratch),
        sorted_keys_(0, card.memory(), card.stream()),
        sorted_pos_(0, card.memory(), card.stream()),
        seg_id_(0, card.memory(), card.stream()),
        unique_keys_(0, card.memory(), card.stream()),
        unique_start_(0, card.memory(), card.stream()),
        occurrence_unique_(0, card.memory(), card.stream()),
        host_count_(1) {}

  // Deduplicates keys[0, n) (card memory). Returns the number of unique keys. Synchronizes
  // `stream` once (the unique count is needed on the host).
  std::size_t run(const uint64_t* keys, std::size_t n, const device::Stream& stream) {
    run_async(keys, n, stream);
    copy_count_async(stream);
    stream.synchronize();
    return collect_count();
  }

  // run() without the host round trip: every output is written on the card, the unique count
  // too (count_on_card()); unique_count() is valid after copy_count_async, a synchronization
  // and collect_count(), or after set_count(). The unique arrays are sized for n.
  void run_async(const uint64_t* keys, std::size_t n, const device::Stream& stream) {
    GPUBOX_EXPECTS(n < (std::size_t{1} << 32), "batch of ", n, " keys exceeds 2^32 positions");
    reserve(n);
    resize_all(n);
    unique_keys_.resize_discard(n);
    unique_start_.resize_discard(n + 1);
    count_known_ = false;
    if (n == 0) {
      device::memset_bytes_async(unique_start_.data(), 0, sizeof(position_t), stream);
      return;
    }
    device::copy_async(sorted_keys_.data(), keys, n, stream);
    with_policy(stream, *scratch_, n, [&](const auto& policy) {
      thrust::sequence(policy, sorted_pos_.begin(), sorted_pos_.end(), position_t{0});
      thrust::stable_sort_by_key(policy, sorted_keys_.begin(), sorted_keys_.end(),
                                 sorted_pos_.begin());
    });
    device::parallel_for(stream, n, MarkSegmentHeads{sorted_keys_.data(), seg_id_.data()});
    with_policy(stream, *scratch_, n, [&](const auto& policy) {
      thrust::inclusive_scan(policy, seg_id_.begin(), seg_id_.end(), seg_id_.begin());
    });
    device::parallel_for(
        stream, n,
        RecordSegments{sorted_keys_.data(), sorted_pos_.data(), seg_id_.data(), unique_keys_.data(),
                       unique_start_.data(), occurrence_unique_.data()});
    device::parallel_for(stream, 1,
                         StoreClosingOffset{unique_start_.data(), seg_id_.data() + (n - 1),
                                            static_cast<position_t>(n)});
  }

  // The unique count of the last run_async, on the card (null for an empty input: the count is
  // 0). Valid until the next call.
  const position_t* count_on_card() const {
    return sorted_pos_.empty() ? nullptr : seg_id_.data() + (sorted_pos_.size() - 1);
  }
  // After run_async: unique_start()[u] = occurrences() for every u past the count on the card,
  // so unique_start() describes occurrences() segments, the ones past the count empty (for
  // kernels sized by that bound, the count never read on the host). Stream-ordered.
  void pad_unique_start_async(const device::Stream& stream) {
    const std::size_t n = sorted_pos_.size();
    if (n == 0) return;
    device::parallel_for(
        stream, n + 1,
        PadUniqueStarts{unique_start_.data(), count_on_card(), static_cast<position_t>(n)});
  }
  // Enqueues the unique count's copy to the host (pinned); collect_count() reads it after the
  // caller synchronized the stream.
  void copy_count_async(const device::Stream& stream) {
    if (sorted_pos_.empty()) {
      host_count_[0] = 0;
      return;
    }
    device::copy_async(host_count_.data(), count_on_card(), 1, stream);
  }
  std::size_t collect_count() {
    unique_count_ = host_count_[0];
    count_known_ = true;
    return unique_count_;
  }
  // The unique count learnt another way (e.g. from the owner counts every card exchanged).
  void set_count(std::size_t count) {
    unique_count_ = count;
    count_known_ = true;
  }

  // Sizes every buffer for inputs of up to n keys, so run_async(n) allocates nothing (device
  // rule 1: call it before enqueueing a collective when run_async follows one).
  void reserve(std::size_t n) {
    sorted_keys_.reserve(n);
    sorted_pos_.reserve(n);
    seg_id_.reserve(n);
    occurrence_unique_.reserve(n);
    unique_keys_.reserve(n);
    unique_start_.reserve(n + 1);
  }

  // Same outputs as run() for keys already unique and ascending (e.g. what a single card sends
  // itself): no sort, every segment has one occurrence. Stream-ordered.
  std::size_t run_unique_sorted(const uint64_t* keys, std::size_t n, const device::Stream& stream) {
    GPUBOX_EXPECTS(n < (std::size_t{1} << 32), "batch of ", n, " keys exceeds 2^32 positions");
    resize_all(n);
    unique_count_ = n;
    count_known_ = true;
    unique_keys_.resize_discard(n);
    unique_start_.resize_discard(n + 1);
    if (n > 0) device::copy_async(unique_keys_.data(), keys, n, stream);
    with_policy(stream, *scratch_, n, [&](const auto& policy) {
      thrust::sequence(policy, sorted_pos_.begin(), sorted_pos_.end(), position_t{0});
      thrust::sequence(policy, occurrence_unique_.begin(), occurrence_unique_.end(), position_t{0});
      thrust::sequence(policy, unique_start_.begin(), unique_start_.end(), position_t{0});
    });
    return n;
  }

  std::size_t unique_count() const {
    GPUBOX_EXPECTS(count_known_, "KeyDedup: the unique count of run_async is not collected yet");
    return unique_count_;
  }
  std::size_t occurrences() const { return sorted_pos_.size(); }
  // Unique keys, ascending (unique_count()).
  const uint64_t* unique_keys() const { return unique_keys_.data(); }
  // Occurrences of unique key u are sorted_positions()[unique_start()[u] .. unique_start()[u+1]).
  const position_t* unique_start() const { return unique_start_.data(); }
  // Input positions in key order (stable).
  const position_t* sorted_positions() const { return sorted_pos_.data(); }
  // occurrence_unique()[i] = unique index of input position i.
  const position_t* occurrence_unique() const { return occurrence_unique_.data(); }

 private:
  void resize_all(std::size_t n) {
    sorted_keys_.resize_discard(n);
    sorted_pos_.resize_discard(n);
    seg_id_.resize_discard(n);
    occurrence_unique_.resize_discard(n);
  }

  ScratchArena* scratch_;
  device::device_buffer<uint64_t> sorted_keys_;
  device::device_buffer<position_t> sorted_pos_;
  device::device_buffer<position_t> seg_id_;
  device::device_buffer<uint64_t> unique_keys_;
  device::device_buffer<position_t> unique_start_;
  device::device_buffer<position_t> occurrence_unique_;
  device::pinned_buffer<position_t> host_count_;
  std::size_t unique_count_ = 0;
  bool count_known_ = true;
};

// Positions at or past *count (when count is given: a unique count known only on the card) get
// the owner total_cards, which sorts after every real owner.
struct ComputeOwners {
  const uint64_t* unique_keys;
  int32_t* owners;
  position_t* order;
  int total_cards;
  const position_t* count;  // null: every position is a unique key
  GPUBOX_HD void operator()(std::size_t u) const {
    const bool real = count == nullptr || u < *count;
    owners[u] = real ? owner_card(unique_keys[u], total_cards) : total_cards;
    order[u] = static_cast<position_t>(u);
  }
};

struct GatherSendKeys {
  const uint64_t* unique_keys;
  const position_t* order;
  uint64_t* send_keys;
  position_t* unique_to_send;
  const position_t* count;  // as in ComputeOwners
  GPUBOX_HD void operator()(std::size_t j) const {
    if (count != nullptr && j >= *count) return;
    const position_t u = order[j];
    send_keys[j] = unique_keys[u];
    unique_to_send[u] = static_cast<position_t>(j);
  }
};

// counts[c] = begin[c + 1] - begin[c]: the keys sent to each card, on the card.
struct OwnerCounts {
  const std::size_t* begin;
  uint64_t* counts;
  GPUBOX_HD void operator()(std::size_t c) const { counts[c] = begin[c + 1] - begin[c]; }
};

class OwnerPlan {
 public:
  // `scratch` (Thrust's temporaries) must outlive the OwnerPlan.
  OwnerPlan(device::Card& card, int total_cards, ScratchArena& scratch)
      : total_cards_(total_cards),
        scratch_(&scratch),
        owners_(0, card.memory(), card.stream()),
        order_(0, card.memory(), card.stream()),
        send_keys_(0, card.memory(), card.stream()),
        unique_to_send_(0, card.memory(), card.stream()),
        owner_begin_(static_cast<std::size_t>(total_cards) + 1, card.memory(), card.stream()),
        host_begin_(static_cast<std::size_t>(total_cards) + 1),
        send_counts_(static_cast<std::size_t>(total_cards), 0) {
    GPUBOX_EXPECTS(total_cards > 0, "total_cards must be positive, got ", total_cards);
  }

  // Groups unique_keys[0, u) (ascending) by owner card. Synchronizes `stream`.
  void run(const uint64_t* unique_keys, std::size_t u, const device::Stream& stream) {
    run_async(unique_keys, nullptr, u, stream);
    device::copy_async(host_begin_.data(), owner_begin_.data(), host_begin_.size(), stream);
    stream.synchronize();
    for (int c = 0; c < total_cards_; ++c) send_counts_[c] = host_begin_[c + 1] - host_begin_[c];
  }

  // run() without the host round trip, for a unique count known only on the card: plans the
  // first *device_count of unique_keys[0, max_unique) (every one when device_count is null).
  // The per-owner counts stay on the card (write_counts_async); send_counts() is valid after
  // set_send_counts().
  void run_async(const uint64_t* unique_keys, const position_t* device_count,
                 std::size_t max_unique, const device::Stream& stream) {
    reserve(max_unique);
    const std::size_t u = max_unique;
    owners_.resize_discard(u);
    order_.resize_discard(u);
    send_keys_.resize_discard(u);
    unique_to_send_.resize_discard(u);
    device::parallel_for(
        stream, u,
        ComputeOwners{unique_keys, owners_.data(), order_.data(), total_cards_, device_count});
    if (total_cards_ > 1 && u > 1) {
      with_policy(stream, *scratch_, u, [&](const auto& policy) {
        // Stable: keys stay ascending inside each owner's block.
        thrust::stable_sort_by_key(policy, owners_.begin(), owners_.end(), order_.begin());
      });
    }
    device::parallel_for(stream, u,
                         GatherSendKeys{unique_keys, order_.data(), send_keys_.data(),
                                        unique_to_send_.data(), device_count});
    // Unreal positions carry owner total_cards: owner_begin[total_cards] is the unique count.
    with_policy(stream, *scratch_, u, [&](const auto& policy) {
      thrust::lower_bound(
          policy, owners_.begin(), owners_.end(), thrust::counting_iterator<int32_t>(0),
          thrust::counting_iterator<int32_t>(total_cards_ + 1), owner_begin_.begin());
    });
  }

  // counts[c] = keys this card sends to card c (total_cards entries, card memory).
  void write_counts_async(uint64_t* counts, const device::Stream& stream) const {
    device::parallel_for(stream, static_cast<std::size_t>(total_cards_),
                         OwnerCounts{owner_begin_.data(), counts});
  }
  // The host copy of those counts, once the caller has them.
  void set_send_counts(const uint64_t* counts) {
    for (int c = 0; c < total_cards_; ++c) send_counts_[c] = counts[c];
  }
  // Sizes every buffer for up to u unique keys (device rule 1, as KeyDedup::reserve).
  void reserve(std::size_t u) {
    owners_.reserve(u);
    order_.reserve(u);
    send_keys_.reserve(u);
    unique_to_send_.reserve(u);
  }

  // Unique keys in send order (grouped by owner).
  const uint64_t* send_keys() const { return send_keys_.data(); }
  // unique_to_send()[u] = send position of unique key u.
  const position_t* unique_to_send() const { return unique_to_send_.data(); }
  // Keys sent to each card (host array of total_cards).
  const std::size_t* send_counts() const { return send_counts_.data(); }

 private:
  int total_cards_;
  ScratchArena* scratch_;
  device::device_buffer<int32_t> owners_;
  device::device_buffer<position_t> order_;
  device::device_buffer<uint64_t> send_keys_;
  device::device_buffer<position_t> unique_to_send_;
  device::device_buffer<std::size_t> owner_begin_;
  device::pinned_buffer<std::size_t> host_begin_;
  std::vector<std::size_t> send_counts_;
};

}  // namespace gpubox::heter_comm::detail
