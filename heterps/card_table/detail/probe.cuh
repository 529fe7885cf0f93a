// The probing engine shared by every CardHashTable operation (bulk kernels, refs, rehash): one
// slot layout, one probe sequence, written once for host and card.
//
// Slots are 16 bytes {key, row}: a lookup touches one cache line (four slots) in the common
// case. A slot's key moves kEmptyKey -> key (CAS, the claim) and key -> kErasedKey (CAS, the
// erase); tombstones are never reused (a rehash purges them), so two inserters of the same key
// always meet at the same slot. The row is written by the claiming thread right after the claim;
// another thread that meets the key before that waits for it (the wait spans a few
// instructions of the claimer; sm_70+ schedules threads independently, so it cannot deadlock).
// The two reserved keys live in side slots (side_rows[0] for kErasedKey, [1] for kEmptyKey).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cuda/atomic>
#include <thread>

#include "common/hash.hpp"
#include "common/macros.hpp"
#include "heterps/card_table/sparse_types.hpp"

namespace gpubox::card_table::detail {

template <class T>
using atomic_ref = cuda::atomic_ref<T, cuda::thread_scope_device>;

GPUBOX_HD GPUBOX_FORCEINLINE bool is_reserved_key(uint64_t key) { return key >= kErasedKey; }
// A slot's key that is a key: neither kEmptyKey (a free slot) nor kErasedKey (a tombstone).
struct IsLiveKey {
  GPUBOX_HD bool operator()(uint64_t key) const { return key != kEmptyKey && key != kErasedKey; }
};
// Side slot of a reserved key: 0 for kErasedKey, 1 for kEmptyKey.
GPUBOX_HD GPUBOX_FORCEINLINE uint32_t side_index(uint64_t key) {
  return static_cast<uint32_t>(key - kErasedKey);
}
// Slots per 64-byte cache line: a probe run starts at the first slot of a line, so a lookup at
// the configured load reads one line (one memory access, prefetchable) in the common case.
inline constexpr uint64_t kSlotsPerLine = 4;

// Home slot: mix64 (owner_card uses fmix64, so a card's keys still spread over its table),
// rounded down to a cache line.
GPUBOX_HD GPUBOX_FORCEINLINE uint64_t home_slot(uint64_t key, uint64_t mask) {
  return mix64(key) & mask & ~(kSlotsPerLine - 1);
}

// Bulk lookups prefetch the home line of the key this many positions ahead (cpu backend):
// enough to cover a memory latency with the ~10 ns of work per key, few enough to stay within
// the line fill buffers (measured: 16 beats 8 and 32 on a 4M-key table).
inline constexpr std::size_t kPrefetchDistance = 16;

// One step of a short wait. On the cpu backend the thread being waited for may have been
// preempted (other processes share the cores), so after a while the waiter yields its core.
GPUBOX_HD GPUBOX_FORCEINLINE void spin_pause(uint32_t spins) {
#if !GPUBOX_ON_DEVICE
  if (spins >= 64) {
    std::this_thread::yield();
    return;
  }
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
#else
  (void)spins;
#endif
}

// Outcome of one insert probe.
enum class InsertStatus : uint32_t { kInserted, kFound, kProbeBoundExceeded };
struct InsertResult {
  row_index_t row;  // the key's row (the candidate when kInserted), kInvalidRow on overflow
  InsertStatus status;
};

// Read-only probing.
struct FindEngine {
  const Slot* slots;
  uint64_t mask;  // capacity - 1 (capacity is a power of two)
  const row_index_t* side_rows;

  GPUBOX_HD row_index_t find(uint64_t key) const {
    if (is_reserved_key(key)) {
      return load_row(side_rows[side_index(key)]);
    }
    uint64_t s = home_slot(key, mask);
    for (uint32_t p = 0; p < kMaxProbe; ++p, s = (s + 1) & mask) {
      const uint64_t k = atomic_ref<uint64_t>(const_cast<uint64_t&>(slots[s].key))
                             .load(cuda::memory_order_relaxed);
      if (k == key) return load_row(slots[s].row);
      if (k == kEmptyKey) return kInvalidRow;
    }
    return kInvalidRow;
  }

  // Hint that `key` will be looked up soon (cpu backend: prefetch its home slot's line).
  GPUBOX_HD GPUBOX_FORCEINLINE void prefetch(uint64_t key) const {
#if !GPUBOX_ON_DEVICE
    __builtin_prefetch(slots + home_slot(key, mask));
#else
    (void)key;
#endif
  }

 private:
  // Atomic views keep a find that overlaps an insert batch race-free (it may miss a key that
  // is being inserted, never read a torn slot).
  GPUBOX_HD static row_index_t load_row(const row_index_t& row) {
    return atomic_ref<row_index_t>(const_cast<row_index_t&>(row)).load(cuda::memory_order_acquire);
  }
};

// Claims slots. Never reuses tombstones (see the file comment).
struct InsertEngine {
  Slot* slots;
  uint64_t mask;
  row_index_t* side_rows;

  // Inserts key -> candidate unless the key is present; returns the key's row either way.
  GPUBOX_HD InsertResult insert(uint64_t key, row_index_t candidate) const {
    if (is_reserved_key(key)) {
      row_index_t expected = kInvalidRow;
      atomic_ref<row_index_t> side(side_rows[side_index(key)]);
      if (side.compare_exchange_strong(expected, candidate, cuda::memory_order_relaxed)) {
        return {candidate, InsertStatus::kInserted};
      }
      return {expected, InsertStatus::kFound};
    }
    uint64_t s = home_slot(key, mask);
    for (uint32_t p = 0; p < kMaxProbe; ++p, s = (s + 1) & mask) {
      atomic_ref<uint64_t> slot_key(slots[s].key);
      uint64_t k = slot_key.load(cuda::memory_order_relaxed);
      if (k == kEmptyKey) {
        if (slot_key.compare_exchange_strong(k, key, cuda::memory_order_relaxed)) {
          atomic_ref<row_index_t>(slots[s].row).store(candidate, cuda::memory_order_release);
          return {candidate, InsertStatus::kInserted};
        }
        // Lost the slot: k now holds the winner's key; fall through and compare it.
      }
      if (k == key) return {wait_for_row(s), InsertStatus::kFound};
    }
    return {kInvalidRow, InsertStatus::kProbeBoundExceeded};
  }

  // Points the key, which must be present, at `row` (its old row is the caller's: the rows
  // CardSparseStore::compact_pool moves); false when it is absent. One thread per key, the keys
  // distinct. Relaxed stores, main slot and side slot alike: no thread of the launch reads a row it
  // writes (no insert or find runs beside a compaction), and the launch boundary orders the stores
  // before any later work on the stream, as it orders the records the launch before copied.
  GPUBOX_HD bool repoint(uint64_t key, row_index_t row) const {
    if (is_reserved_key(key)) {
      atomic_ref<row_index_t> side(side_rows[side_index(key)]);
      if (side.load(cuda::memory_order_relaxed) == kInvalidRow) return false;
      side.store(row, cuda::memory_order_relaxed);
      return true;
    }
    uint64_t s = home_slot(key, mask);
    for (uint32_t p = 0; p < kMaxProbe; ++p, s = (s + 1) & mask) {
      const uint64_t k = atomic_ref<uint64_t>(slots[s].key).load(cuda::memory_order_relaxed);
      if (k == key) {
        atomic_ref<row_index_t>(slots[s].row).store(row, cuda::memory_order_relaxed);
        return true;
      }
      if (k == kEmptyKey) return false;
    }
    return false;
  }

  // Removes `key`; returns its row, or kInvalidRow when it was absent (or erased by another
  // thread of the same batch: exactly one eraser gets the row).
  GPUBOX_HD row_index_t erase(uint64_t key) const {
    if (is_reserved_key(key)) {
      return atomic_ref<row_index_t>(side_rows[side_index(key)])
          .exchange(kInvalidRow, cuda::memory_order_relaxed);
    }
    uint64_t s = home_slot(key, mask);
    for (uint32_t p = 0; p < kMaxProbe; ++p, s = (s + 1) & mask) {
      atomic_ref<uint64_t> slot_key(slots[s].key);
      uint64_t k = slot_key.load(cuda::memory_order_relaxed);
      if (k == key) {
        if (slot_key.compare_exchange_strong(k, kErasedKey, cuda::memory_order_relaxed)) {
          return atomic_ref<row_index_t>(slots[s].row).load(cuda::memory_order_relaxed);
        }
        return kInvalidRow;
      }
      if (k == kEmptyKey) return kInvalidRow;
    }
    return kInvalidRow;
  }

 private:
  GPUBOX_HD row_index_t wait_for_row(uint64_t s) const {
    atomic_ref<row_index_t> row(slots[s].row);
    row_index_t r = row.load(cuda::memory_order_acquire);
    for (uint32_t spins = 0; r == kInvalidRow; ++spins) {
      spin_pause(spins);
      r = row.load(cuda::memory_order_acquire);
    }
    return r;
  }
};

}  // namespace gpubox::card_table::detail
