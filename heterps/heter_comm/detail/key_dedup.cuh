// Key deduplication and per-owner planning for one card's batch, fused: the portable engine under
// HeterComm (device::PairSorter and device::Scanner, CUB on CUDA and their twins on the cpu
// backend, plus parallel_for functors: the cpu build runs exactly this code).
//
//   KeyDedup   keys[n] -> unique keys grouped by owner card (owner_card(key, partitions); one
//              partition: plain ascending order), ascending inside each owner, which is the order
//              they are sent in; each owner's first unique index (owner_begin, on the card);
//              each occurrence's unique index; each unique key's segment [start[u], start[u+1])
//              of occurrences in key order (stable: occurrences of one key stay in position
//              order, so reductions over a segment sum in a fixed order, reproducible run to run).
//
// One radix sort by (owner, key) gives the dedup and the owner plan at once (they were two sorts,
// a scan, a binary search and six kernels): 4 launches (prepare, sort, scan, record), every
// count written on the card. The buffers and the sort's and scan's temporary storage are owned
// and sized by reserve() (the pass's largest batch): in steady state a step allocates nothing.
// Not thread-safe: one card thread drives it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "common/hash.hpp"
#include "common/macros.hpp"
#include "heterps/device/card.hpp"
#include "heterps/device/exec_policy.cuh"
#include "heterps/device/memory.hpp"
#include "heterps/device/parallel_for.cuh"
#include "heterps/device/sort_scan.cuh"
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

// Which positions of a padded input hold data (HeterComm's fixed-size steps, whose sizes are the
// pass's maxima): position i, in block i / block, is live while i % block < the block's count,
// counts[(i / block) * stride] (card memory, read when the kernel runs: a step graph replays with
// each step's counts). Null counts: every position is live (an unpadded input).
struct LiveSlots {
  const uint64_t* counts = nullptr;
  std::size_t block = 1;
  std::size_t stride = 1;
  GPUBOX_HD bool operator()(std::size_t i) const {
    return counts == nullptr || i % block < counts[i / block * stride];
  }
  // The live positions among [0, n), n a multiple of block (or n <= block).
  GPUBOX_HD std::size_t total(std::size_t n) const {
    if (counts == nullptr) return n;
    std::size_t sum = 0;
    for (std::size_t b = 0; b * block < n; ++b) {
      const std::size_t room = n - b * block < block ? n - b * block : block;
      const uint64_t count = counts[b * stride];
      sum += count < room ? static_cast<std::size_t>(count) : room;
    }
    return sum;
  }
};

// The sort's input: each occurrence's key under its owner (0 with one partition) and its
// position. A dead position of a padded input (LiveSlots) sorts after every live one, under the
// owner `partitions`, and its key is not read (key 0).
struct PrepareSort {
  const uint64_t* keys;
  device::WideKey* wide;
  position_t* positions;
  int partitions;
  LiveSlots live;
  GPUBOX_HD void operator()(std::size_t i) const {
    if (live(i)) {
      write_live(i);
    } else {
      write_dead(i);
    }
  }
#if !defined(GPUBOX_BACKEND_CUDA)
  // cpu: block by block, each block's live count read once (live(i) divides twice a position).
  void run_range(std::size_t begin, std::size_t end) const {
    for (std::size_t i = begin; i < end;) {
      std::size_t block_end = end;
      std::size_t live_end = end;
      if (live.counts != nullptr) {
        const std::size_t block = i / live.block;
        const std::size_t first = block * live.block;
        block_end = std::min(end, first + live.block);
        const uint64_t count = live.counts[block * live.stride];
        live_end = count < block_end - first ? first + static_cast<std::size_t>(count) : block_end;
      }
      for (; i < live_end; ++i) write_live(i);
      for (; i < block_end; ++i) write_dead(i);
    }
  }
#endif
  GPUBOX_HD void write_live(std::size_t i) const {
    const uint32_t owner =
        partitions > 1 ? static_cast<uint32_t>(owner_card(keys[i], partitions)) : 0u;
    wide[i] = device::WideKey{keys[i], owner};
    positions[i] = static_cast<position_t>(i);
  }
  GPUBOX_HD void write_dead(std::size_t i) const {
    wide[i] = device::WideKey{0, static_cast<uint64_t>(partitions)};
    positions[i] = static_cast<position_t>(i);
  }
};

// 1 where sorted position i starts a key's segment, else 0: the scan's input. A key's owner is
// a function of the key; the high word tells a padded input's dead positions from a live key.
struct SegmentHead {
  const device::WideKey* sorted;
  GPUBOX_HD position_t operator()(std::size_t i) const {
    return (i == 0 || sorted[i].low != sorted[i - 1].low || sorted[i].high != sorted[i - 1].high)
               ? 1u
               : 0u;
  }
};

// After the scan, seg_id[i] = 1 + unique index of sorted position i (seg_id[n - 1]: the count).
// Writes every output of KeyDedup in one pass: the unique keys, their segments' starts and the
// closing one (unique_start[count] = n), each occurrence's unique index, each owner's first
// unique index (owner_begin, partitions + 1 entries, when given), and with `pad` the starts past
// the count (unique_start[u] = n for u in (count, n]: empty segments, so kernels launched over the
// bound n of segments sum nothing there).
struct RecordSegments {
  const device::WideKey* sorted;
  const position_t* sorted_pos;
  const position_t* seg_id;
  uint64_t* unique_keys;
  position_t* unique_start;
  position_t* occurrence_unique;
  position_t* owner_begin;
  uint32_t partitions;
  position_t n;
  bool pad;
  GPUBOX_HD void operator()(std::size_t i) const {
    const position_t u = seg_id[i] - 1;
    const position_t count = seg_id[n - 1];
    occurrence_unique[sorted_pos[i]] = u;
    if (i == 0 || sorted[i].low != sorted[i - 1].low) {
      unique_keys[u] = sorted[i].low;
      unique_start[u] = static_cast<position_t>(i);
      if (owner_begin != nullptr) {  // the owners from the previous key's (exclusive) to this one's
        const auto owner = static_cast<uint32_t>(sorted[i].high);
        for (uint32_t c = i == 0 ? 0u : static_cast<uint32_t>(sorted[i - 1].high) + 1; c <= owner;
             ++c) {
          owner_begin[c] = u;
        }
      }
    }
    if (i + 1 == n) {
      unique_start[count] = n;
      if (owner_begin != nullptr) {
        for (uint32_t c = static_cast<uint32_t>(sorted[i].high) + 1; c <= partitions; ++c) {
          owner_begin[c] = count;
        }
      }
    }
    if (pad && count + 1 + i <= n) unique_start[count + 1 + i] = n;
  }
};

// RecordSegments for a padded input (KeyDedup::run_padded): the live positions sort first
// (PrepareSort), and only they form segments: count = the live segments, each output as
// RecordSegments writes it, and unique_start[u] = the live positions for u in [count, n], so
// every segment past the count is empty (kernels launched over the bound n sum nothing there).
// owner_begin[partitions] is the live count.
struct RecordLiveSegments {
  const device::WideKey* sorted;
  const position_t* sorted_pos;
  const position_t* seg_id;
  uint64_t* unique_keys;
  position_t* unique_start;
  position_t* occurrence_unique;
  position_t* owner_begin;
  uint32_t partitions;
  position_t n;
  LiveSlots live;
  GPUBOX_HD void operator()(std::size_t i) const {
    const auto live_n = static_cast<position_t>(live.total(n));
    record(i, live_n, live_n > 0 ? seg_id[live_n - 1] : 0);
  }
#if !defined(GPUBOX_BACKEND_CUDA)
  // cpu: the live count and the segment count read once for the range, not once a position.
  void run_range(std::size_t begin, std::size_t end) const {
    const auto live_n = static_cast<position_t>(live.total(n));
    const position_t count = live_n > 0 ? seg_id[live_n - 1] : 0;
    for (std::size_t i = begin; i < end; ++i) record(i, live_n, count);
  }
#endif
  // Position i's outputs, given the live positions and the live segments.
  GPUBOX_HD void record(std::size_t i, position_t live_n, position_t count) const {
    if (count + i <= n) unique_start[count + i] = live_n;  // [count, n) and, when count > 0, n
    if (count == 0 && i == 0) unique_start[n] = live_n;
    if (live_n == 0) {
      if (i == 0) {
        for (uint32_t c = 0; c <= partitions; ++c) owner_begin[c] = 0;
      }
      return;
    }
    if (i >= live_n) return;  // dead: no segment
    const position_t u = seg_id[i] - 1;
    occurrence_unique[sorted_pos[i]] = u;
    const auto owner = static_cast<uint32_t>(sorted[i].high);
    if (i == 0 || sorted[i].low != sorted[i - 1].low || owner != sorted[i - 1].high) {
      unique_keys[u] = sorted[i].low;
      unique_start[u] = static_cast<position_t>(i);
      for (uint32_t c = i == 0 ? 0u : static_cast<uint32_t>(sorted[i - 1].high) + 1; c <= owner;
           ++c) {
        owner_begin[c] = u;
      }
    }
    if (i + 1 == live_n) {
      for (uint32_t c = owner + 1; c <= partitions; ++c) owner_begin[c] = count;
    }
  }
};

// *out = live.total(n) (KeyDedup::write_live_count).
struct WriteLiveCount {
  LiveSlots live;
  std::size_t n;
  position_t* out;
  GPUBOX_HD void operator()(std::size_t) const { *out = static_cast<position_t>(live.total(n)); }
};

// KeyDedup::run_unique_sorted's outputs: every segment one occurrence.
struct IdentitySegments {
  position_t* sorted_pos;
  position_t* occurrence_unique;
  position_t* unique_start;
  position_t n;
  GPUBOX_HD void operator()(std::size_t i) const {
    sorted_pos[i] = static_cast<position_t>(i);
    occurrence_unique[i] = static_cast<position_t>(i);
    unique_start[i] = static_cast<position_t>(i);
    if (i + 1 == n) unique_start[n] = n;
  }
};

// counts[c] = begin[c + 1] - begin[c]: the keys sent to each card, on the card.
struct OwnerCounts {
  const position_t* begin;
  uint64_t* counts;
  GPUBOX_HD void operator()(std::size_t c) const { counts[c] = begin[c + 1] - begin[c]; }
};

class KeyDedup {
 public:
  // `partitions`: the owner cards the unique keys are grouped by (1: none; owner_begin is then
  // {0, count}).
  KeyDedup(device::Card& card, int partitions)
      : partitions_(partitions),
        wide_keys_(0, card.memory(), card.stream()),
        sorted_keys_(0, card.memory(), card.stream()),
        positions_(0, card.memory(), card.stream()),
        sorted_pos_(0, card.memory(), card.stream()),
        seg_id_(0, card.memory(), card.stream()),
        unique_keys_(0, card.memory(), card.stream()),
        unique_start_(0, card.memory(), card.stream()),
        occurrence_unique_(0, card.memory(), card.stream()),
        owner_begin_(static_cast<std::size_t>(partitions) + 1, card.memory(), card.stream()),
        sorter_(card.memory(), card.stream()),
        scanner_(card.memory(), card.stream()),
        host_count_(1) {
    GPUBOX_EXPECTS(partitions > 0, "KeyDedup: partitions must be positive, got ", partitions);
    owner_bits_ = 0;
    while ((uint64_t{1} << owner_bits_) < static_cast<uint64_t>(partitions)) ++owner_bits_;
    padded_bits_ = 0;  // the owners and the dead positions' `partitions`
    while ((uint64_t{1} << padded_bits_) <= static_cast<uint64_t>(partitions)) ++padded_bits_;
  }

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
  // and collect_count(), or after set_count(). The unique arrays are sized for n. `pad`: the
  // segment starts past the count are n (see RecordSegments), so unique_start() describes n
  // segments. 4 launches (n > 0).
  void run_async(const uint64_t* keys, std::size_t n, const device::Stream& stream,
                 bool pad = false) {
    GPUBOX_EXPECTS(n < (std::size_t{1} << 32), "batch of ", n, " keys exceeds 2^32 positions");
    reserve(n);
    resize_all(n);
    count_known_ = false;
    count_on_card_ = n > 0;
    if (n == 0) {
      device::memset_bytes_async(unique_start_.data(), 0, sizeof(position_t), stream);
      device::memset_bytes_async(owner_begin_.data(), 0, owner_begin_.size() * sizeof(position_t),
                                 stream);
      return;
    }
    device::parallel_for(stream, n,
                         PrepareSort{keys, wide_keys_.data(), positions_.data(), partitions_, {}});
    sorter_.run(wide_keys_.data(), sorted_keys_.data(), positions_.data(), sorted_pos_.data(), n,
                owner_bits_, stream);
    scanner_.inclusive(SegmentHead{sorted_keys_.data()}, seg_id_.data(), n, stream);
    device::parallel_for(
        stream, n,
        RecordSegments{sorted_keys_.data(), sorted_pos_.data(), seg_id_.data(), unique_keys_.data(),
                       unique_start_.data(), occurrence_unique_.data(), owner_begin_.data(),
                       static_cast<uint32_t>(partitions_), static_cast<position_t>(n), pad});
  }

  // run_async over a padded input of n positions (the pass's largest), of which `live` says which
  // hold keys (their count on the card, read when the kernels run): the outputs describe the live
  // keys only, at the same places as run_async over them would put them; the segments past their
  // count are empty (RecordLiveSegments). The live count is on the card: live_count_on_card().
  // Every size is n, fixed: within reserve(n) it allocates nothing and waits for nothing, so a
  // step graph can capture it. 4 launches (n > 0).
  void run_padded(const uint64_t* keys, std::size_t n, const LiveSlots& live,
                  const device::Stream& stream) {
    GPUBOX_EXPECTS(n < (std::size_t{1} << 32), "batch of ", n, " keys exceeds 2^32 positions");
    reserve(n);
    resize_all(n);
    count_known_ = false;
    count_on_card_ = false;
    if (n == 0) {
      run_async(keys, 0, stream);
      return;
    }
    device::parallel_for(
        stream, n, PrepareSort{keys, wide_keys_.data(), positions_.data(), partitions_, live});
    sorter_.run(wide_keys_.data(), sorted_keys_.data(), positions_.data(), sorted_pos_.data(), n,
                padded_bits_, stream);
    scanner_.inclusive(SegmentHead{sorted_keys_.data()}, seg_id_.data(), n, stream);
    device::parallel_for(
        stream, n,
        RecordLiveSegments{sorted_keys_.data(), sorted_pos_.data(), seg_id_.data(),
                           unique_keys_.data(), unique_start_.data(), occurrence_unique_.data(),
                           owner_begin_.data(), static_cast<uint32_t>(partitions_),
                           static_cast<position_t>(n), live});
  }
  // After run_unique_sorted over a padded input whose live positions come first (a single
  // card's received block): its live count into live_count_on_card(). One launch.
  void write_live_count(const LiveSlots& live, std::size_t n, const device::Stream& stream) {
    device::parallel_for(stream, 1, WriteLiveCount{live, n, owner_begin_.data() + partitions_});
  }
  // The live unique count of the last run_padded, on the card (owner_begin's last entry).
  const position_t* live_count_on_card() const { return owner_begin_.data() + partitions_; }

  // The unique count of the last run_async, on the card: null for an empty input (the count is
  // 0) and after run_unique_sorted (no scan ran; unique_count() is known). Valid until the next
  // call.
  const position_t* count_on_card() const {
    return count_on_card_ ? seg_id_.data() + (sorted_pos_.size() - 1) : nullptr;
  }
  // Enqueues the unique count's copy to the host (pinned); collect_count() reads it after the
  // caller synchronized the stream.
  void copy_count_async(const device::Stream& stream) {
    if (!count_on_card_) {
      host_count_[0] = static_cast<position_t>(count_known_ ? unique_count_ : 0);
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
  // counts[c] = unique keys of owner c (partitions entries, card memory), from the last run.
  void write_counts_async(uint64_t* counts, const device::Stream& stream) const {
    device::parallel_for(stream, static_cast<std::size_t>(partitions_),
                         OwnerCounts{owner_begin_.data(), counts});
  }

  // Sizes every buffer, and the sort's and scan's temporary storage, for inputs of up to n keys,
  // so run_async(n) allocates nothing (device rule 1: call it before enqueueing a collective when
  // run_async follows one). `sorting` false: only what run_unique_sorted(n) needs.
  void reserve(std::size_t n, bool sorting = true) {
    sorted_pos_.reserve(n);
    occurrence_unique_.reserve(n);
    unique_keys_.reserve(n);
    unique_start_.reserve(n + 1);
    if (!sorting) return;
    wide_keys_.reserve(n);
    sorted_keys_.reserve(n);
    positions_.reserve(n);
    seg_id_.reserve(n);
    sorter_.reserve(n);
    scanner_.reserve(n);
  }

  // Same outputs as run() for keys already unique and ascending (e.g. what a single card sends
  // itself): no sort, every segment has one occurrence. Stream-ordered; one launch (+ a copy).
  std::size_t run_unique_sorted(const uint64_t* keys, std::size_t n, const device::Stream& stream) {
    GPUBOX_EXPECTS(n < (std::size_t{1} << 32), "batch of ", n, " keys exceeds 2^32 positions");
    resize_outputs(n);
    unique_count_ = n;
    count_known_ = true;
    count_on_card_ = false;
    if (n == 0) {
      device::memset_bytes_async(unique_start_.data(), 0, sizeof(position_t), stream);
      return 0;
    }
    device::copy_async(unique_keys_.data(), keys, n, stream);
    device::parallel_for(stream, n,
                         IdentitySegments{sorted_pos_.data(), occurrence_unique_.data(),
                                          unique_start_.data(), static_cast<position_t>(n)});
    return n;
  }

  std::size_t unique_count() const {
    GPUBOX_EXPECTS(count_known_, "KeyDedup: the unique count of run_async is not collected yet");
    return unique_count_;
  }
  std::size_t occurrences() const { return sorted_pos_.size(); }
  // Unique keys, grouped by owner, ascending inside each (unique_count()).
  const uint64_t* unique_keys() const { return unique_keys_.data(); }
  // Occurrences of unique key u are sorted_positions()[unique_start()[u] .. unique_start()[u+1]).
  const position_t* unique_start() const { return unique_start_.data(); }
  // Input positions in key order (stable).
  const position_t* sorted_positions() const { return sorted_pos_.data(); }
  // occurrence_unique()[i] = unique index of input position i.
  const position_t* occurrence_unique() const { return occurrence_unique_.data(); }
  // owner_begin()[c] = the first unique index of owner c (partitions + 1 entries, card memory;
  // the last is the unique count). Written by run_async.
  const position_t* owner_begin() const { return owner_begin_.data(); }
  int partitions() const { return partitions_; }

 private:
  void resize_all(std::size_t n) {
    wide_keys_.resize_discard(n);
    sorted_keys_.resize_discard(n);
    positions_.resize_discard(n);
    seg_id_.resize_discard(n);
    resize_outputs(n);
  }
  void resize_outputs(std::size_t n) {
    sorted_pos_.resize_discard(n);
    occurrence_unique_.resize_discard(n);
    unique_keys_.resize_discard(n);
    unique_start_.resize_discard(n + 1);
  }

  int partitions_;
  int owner_bits_ = 0;   // bits of the sort's high word: ceil(log2(partitions))
  int padded_bits_ = 0;  // run_padded's: ceil(log2(partitions + 1))
  device::device_buffer<device::WideKey> wide_keys_;
  device::device_buffer<device::WideKey> sorted_keys_;
  device::device_buffer<position_t> positions_;
  device::device_buffer<position_t> sorted_pos_;
  device::device_buffer<position_t> seg_id_;
  device::device_buffer<uint64_t> unique_keys_;
  device::device_buffer<position_t> unique_start_;
  device::device_buffer<position_t> occurrence_unique_;
  device::device_buffer<position_t> owner_begin_;
  device::PairSorter<position_t> sorter_;
  device::Scanner<position_t> scanner_;
  device::pinned_buffer<position_t> host_count_;
  std::size_t unique_count_ = 0;
  bool count_known_ = true;
  bool count_on_card_ = false;  // the last run scanned: seg_id_'s last entry holds the count
};

}  // namespace gpubox::heter_comm::detail
