// Open-addressing map uint64 key -> uint32 row index for one host-tier shard. Linear probing
// with backward-shift deletion (no tombstones, so probe lengths stay short under churn), load
// factor at most 0.7 (about 0.35 right after growth). A slot is 12 bytes (key and index packed
// at 4-byte alignment; x86 and ARM load the unaligned key at no cost), a quarter less than the
// padded 16. Not thread-safe: the owning shard's mutex guards it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/error.hpp"
#include "common/hash.hpp"
#include "common/macros.hpp"

namespace gpubox::table {

class KeyIndexMap {
 public:
  static constexpr uint32_t kAbsent = 0xffffffffu;

  KeyIndexMap() { rehash(16); }

  std::size_t size() const { return size_; }
  std::size_t memory_bytes() const { return slots_.capacity() * sizeof(Slot); }
  std::size_t capacity() const { return slots_.size(); }

  // Bytes of one slot, and the fill that triggers growth (size + 1 > capacity * kMaxLoad).
  static constexpr std::size_t kSlotBytes = 12;
  static constexpr double kMaxLoad = 0.7;

  uint32_t find(uint64_t key) const {
    for (std::size_t i = home(key);; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.value == kAbsent) return kAbsent;
      if (s.key == key) return s.value;
    }
  }

  // Hints the cache about the slot find(key) starts at (bulk lookups prefetch a few keys ahead).
  // Forced inline: a function whose only effect is a prefetch is one without effects to g++
  // (ipa-pure-const), and a call it did not inline first is dropped (row_arena.hpp).
  GPUBOX_FORCEINLINE void prefetch(uint64_t key) const { __builtin_prefetch(&slots_[home(key)]); }

  // Precondition: `key` is absent and `value` != kAbsent.
  void insert(uint64_t key, uint32_t value) {
    if ((size_ + 1) * 10 > slots_.size() * 7) rehash(slots_.size() * 2);
    place(key, value);
    ++size_;
  }

  // Points `key`, which must be present, at `value` (!= kAbsent).
  void assign(uint64_t key, uint32_t value) {
    std::size_t i = home(key);
    while (slots_[i].key != key || slots_[i].value == kAbsent) {
      GPUBOX_EXPECTS(slots_[i].value != kAbsent, "key index: assign to absent key ", key);
      i = (i + 1) & mask_;
    }
    slots_[i].value = value;
  }

  // Removes `key`; returns its value, or kAbsent when it was not there.
  uint32_t erase(uint64_t key) {
    std::size_t i = home(key);
    for (;; i = (i + 1) & mask_) {
      if (slots_[i].value == kAbsent) return kAbsent;
      if (slots_[i].key == key) break;
    }
    const uint32_t value = slots_[i].value;
    // Backward shift: pull later entries of the probe run into the hole when their home allows.
    std::size_t hole = i;
    for (std::size_t j = (i + 1) & mask_; slots_[j].value != kAbsent; j = (j + 1) & mask_) {
      const std::size_t h = home(slots_[j].key);
      const bool movable = hole <= j ? (h <= hole || h > j) : (h <= hole && h > j);
      if (movable) {
        slots_[hole] = slots_[j];
        hole = j;
      }
    }
    slots_[hole].value = kAbsent;
    --size_;
    return value;
  }

  // Grows the map to at least `slots` slots (rounded up to a power of two) now, so that it holds
  // slots * kMaxLoad keys without growing again (a growth briefly holds the old and the new
  // slots). clear() gives the memory back.
  void reserve(std::size_t slots) {
    std::size_t capacity = slots_.size();
    while (capacity < slots) capacity *= 2;
    if (capacity > slots_.size()) rehash(capacity);
  }

  void clear() {
    // A fresh small array, so the old one is freed now (assign would keep its capacity, and a
    // reserve right after would hold both).
    std::vector<Slot>(16).swap(slots_);
    mask_ = 15;
    size_ = 0;
  }

  // fn(key, value) for every entry, in no particular order. fn must not modify the map.
  template <class Fn>
  void for_each(Fn&& fn) const {
    for (const Slot& s : slots_) {
      if (s.value != kAbsent) fn(s.key, s.value);
    }
  }

 private:
#pragma pack(push, 4)
  struct Slot {
    uint64_t key = 0;
    uint32_t value = kAbsent;
  };
#pragma pack(pop)
  static_assert(sizeof(Slot) == kSlotBytes, "slots are packed to 12 bytes");

  std::size_t home(uint64_t key) const { return static_cast<std::size_t>(fmix64(key)) & mask_; }

  void place(uint64_t key, uint32_t value) {
    std::size_t i = home(key);
    while (slots_[i].value != kAbsent) i = (i + 1) & mask_;
    slots_[i] = Slot{key, value};
  }

  void rehash(std::size_t capacity) {
    std::vector<Slot> old;
    old.swap(slots_);
    slots_.assign(capacity, Slot{});
    mask_ = capacity - 1;
    for (const Slot& s : old) {
      if (s.value != kAbsent) place(s.key, s.value);
    }
  }

  std::vector<Slot> slots_;
  std::size_t mask_ = 0;
  std::size_t size_ = 0;
};

}  // namespace gpubox::table
