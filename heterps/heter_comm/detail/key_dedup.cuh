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

struct StoreOffset {
  position_t* at;
  position_t value;
  GPUBOX_HD void operator()(std::size_t) const { *at = value; }
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
    GPUBOX_EXPECTS(n < (std::size_t{1} << 32), "batch of ", n, " keys exceeds 2^32 positions");
    resize_all(n);
    if (n == 0) {
      unique_count_ = 0;
      unique_start_.resize_discard(1);
      device::memset_bytes_async(unique_start_.data(), 0, sizeof(position_t), stream);
      return 0;
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
    device::copy_async(host_count_.data(), seg_id_.data() + (n - 1), 1, stream);
    stream.synchronize();
    unique_count_ = host_count_[0];
    unique_keys_.resize_discard(unique_count_);
    unique_start_.resize_discard(unique_count_ + 1);
    device::parallel_for(
        stream, n,
        RecordSegments{sorted_keys_.data(), sorted_pos_.data(), seg_id_.data(), unique_keys_.data(),
                       unique_start_.data(), occurrence_unique_.data()});
    // The closing offset, written on the card (a host-to-card copy from a local would need a
    // synchronization before the local goes away).
    device::parallel_for(
        stream, 1, StoreOffset{unique_start_.data() + unique_count_, static_cast<position_t>(n)});
    return unique_count_;
  }

  // Same outputs as run() for keys already unique and ascending (e.g. what a single card sends
  // itself): no sort, every segment has one occurrence. Stream-ordered.
  std::size_t run_unique_sorted(const uint64_t* keys, std::size_t n, const device::Stream& stream) {
    GPUBOX_EXPECTS(n < (std::size_t{1} << 32), "batch of ", n, " keys exceeds 2^32 positions");
    resize_all(n);
    unique_count_ = n;
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

  std::size_t unique_count() const { return unique_count_; }
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
};

struct ComputeOwners {
  const uint64_t* unique_keys;
  int32_t* owners;
  position_t* order;
  int total_cards;
  GPUBOX_HD void operator()(std::size_t u) const {
    owners[u] = owner_card(unique_keys[u], total_cards);
    order[u] = static_cast<position_t>(u);
  }
};

struct GatherSendKeys {
  const uint64_t* unique_keys;
  const position_t* order;
  uint64_t* send_keys;
  position_t* unique_to_send;
  GPUBOX_HD void operator()(std::size_t j) const {
    const position_t u = order[j];
    send_keys[j] = unique_keys[u];
    unique_to_send[u] = static_cast<position_t>(j);
  }
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
    owners_.resize_discard(u);
    order_.resize_discard(u);
    send_keys_.resize_discard(u);
    unique_to_send_.resize_discard(u);
    device::parallel_for(stream, u,
                         ComputeOwners{unique_keys, owners_.data(), order_.data(), total_cards_});
    if (total_cards_ > 1 && u > 1) {
      with_policy(stream, *scratch_, u, [&](const auto& policy) {
        // Stable: keys stay ascending inside each owner's block.
        thrust::stable_sort_by_key(policy, owners_.begin(), owners_.end(), order_.begin());
      });
    }
    device::parallel_for(
        stream, u,
        GatherSendKeys{unique_keys, order_.data(), send_keys_.data(), unique_to_send_.data()});
    with_policy(stream, *scratch_, u, [&](const auto& policy) {
      thrust::lower_bound(
          policy, owners_.begin(), owners_.end(), thrust::counting_iterator<int32_t>(0),
          thrust::counting_iterator<int32_t>(total_cards_ + 1), owner_begin_.begin());
    });
    device::copy_async(host_begin_.data(), owner_begin_.data(), host_begin_.size(), stream);
    stream.synchronize();
    for (int c = 0; c < total_cards_; ++c) send_counts_[c] = host_begin_[c + 1] - host_begin_[c];
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
