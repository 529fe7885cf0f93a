// Chunked, stable row storage for one host-tier shard: rows are `stride` floats each, allocated
// in chunks of rows_per_chunk (a power of two, kMaxRowsPerChunk unless a small memory budget
// asks for less, so that the last chunk's unused rows stay small beside it), and never move when
// the arena grows (an index stays valid until the row is released). The per-row modification epoch
// and three flags sit in a parallel array (the flags in the epoch word's top bits: epochs count
// saves and stay below 2^29); the key does not (the shard's KeyIndexMap holds it: 8 bytes a row
// saved). Released indices are reused, and compact() gives back the chunks that released rows
// leave beyond what the live rows need. Not thread-safe: the owning shard's mutex guards it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "common/error.hpp"
#include "common/macros.hpp"
#include "table/sparse_row/accessor.hpp"

namespace gpubox::table::detail {

// Prefetches every cache line of [first, first + bytes). Forced inline: see RowArena::prefetch.
GPUBOX_FORCEINLINE void prefetch_lines(const void* first, std::size_t bytes) {
  const char* at = static_cast<const char*>(first);
  for (std::size_t offset = 0; offset < bytes; offset += 64) __builtin_prefetch(at + offset);
  if (bytes > 0) __builtin_prefetch(at + bytes - 1);
}

class RowArena {
 public:
  static constexpr uint32_t kMaxRowsPerChunk = 1024;

  explicit RowArena(int32_t stride, uint32_t rows_per_chunk = kMaxRowsPerChunk)
      : stride_(stride), chunk_shift_(log2_of(rows_per_chunk)) {}
  RowArena(RowArena&&) = default;
  RowArena& operator=(RowArena&&) = default;

  int32_t stride() const { return stride_; }
  std::size_t live_rows() const { return allocated_ - free_.size(); }
  std::size_t memory_bytes() const {
    return chunks_.size() * rows_per_chunk() * (stride_ * sizeof(float) + kMetadataBytes) +
           free_.capacity() * sizeof(uint32_t);
  }
  // Floats and metadata of every row of the allocated chunks, live or free.
  std::size_t allocated_row_bytes() const {
    return chunks_.size() * rows_per_chunk() * (stride_ * sizeof(float) + kMetadataBytes);
  }
  // Bytes a row carries besides its floats (the modification epoch and the flags).
  static constexpr std::size_t kMetadataBytes = sizeof(uint32_t);
  static constexpr uint32_t kPinBit = uint32_t{1} << 31;
  // The disk tier holds a copy of the row (it was read back from there and kept) ...
  static constexpr uint32_t kDiskCopyBit = uint32_t{1} << 30;
  // ... equal to it, epoch included: set by set_disk_copy, cleared by set_epoch (a change).
  static constexpr uint32_t kDiskCleanBit = uint32_t{1} << 29;
  static constexpr uint32_t kFlagBits = kPinBit | kDiskCopyBit | kDiskCleanBit;

  uint32_t rows_per_chunk() const { return uint32_t{1} << chunk_shift_; }
  float* row(uint32_t index) {
    return chunks_[index >> chunk_shift_].get() +
           std::size_t(index & (rows_per_chunk() - 1)) * stride_;
  }
  const float* row(uint32_t index) const {
    return chunks_[index >> chunk_shift_].get() +
           std::size_t(index & (rows_per_chunk() - 1)) * stride_;
  }
  // Forced inline here and below: g++ takes a function whose only effect is a prefetch for one
  // without effects (ipa-pure-const) and drops the calls to it it did not inline first (pull's
  // and push's prefetches were not in the binary).
  // Every cache line of the row (152 bytes at mf_dim 8 span 3 or 4) and its epoch word: the
  // loops that prefetch copy the whole row and set its flags.
  GPUBOX_FORCEINLINE void prefetch(uint32_t index) const {
    prefetch_lines(row(index), stride_ * sizeof(float));
    __builtin_prefetch(&epochs_[index]);
  }
  uint32_t epoch(uint32_t index) const { return epochs_[index] & ~kFlagBits; }
  // The row changed at `epoch`: a disk copy it has is stale from now on (kDiskCleanBit cleared).
  void set_epoch(uint32_t index, uint32_t epoch) {
    epochs_[index] = (epochs_[index] & (kPinBit | kDiskCopyBit)) | checked(epoch);
  }
  // A pinned row belongs to a pass in flight (pulled, not yet written back); eviction takes
  // unpinned rows first.
  bool pinned(uint32_t index) const { return (epochs_[index] & kPinBit) != 0; }
  void set_pinned(uint32_t index, bool pin) {
    epochs_[index] = pin ? epochs_[index] | kPinBit : epochs_[index] & ~kPinBit;
  }
  // Whether the disk tier holds a copy of the row, and whether that copy is current (the row has
  // not changed since set_disk_copy). A new row has none.
  bool disk_copy(uint32_t index) const { return (epochs_[index] & kDiskCopyBit) != 0; }
  bool disk_copy_clean(uint32_t index) const { return (epochs_[index] & kDiskCleanBit) != 0; }
  // The row was just read from the disk tier, which keeps its copy: clean (`clean`) or not.
  void set_disk_copy(uint32_t index, bool clean) {
    epochs_[index] = (epochs_[index] & ~kDiskCleanBit) | kDiskCopyBit | (clean ? kDiskCleanBit : 0);
  }
  // The disk copy is gone (deleted): the row has none from now on.
  void clear_disk_copy(uint32_t index) { epochs_[index] &= ~(kDiskCopyBit | kDiskCleanBit); }

  // A row index (contents unspecified until the caller writes them).
  uint32_t allocate(uint32_t epoch) {
    uint32_t index;
    if (!free_.empty()) {
      index = free_.back();
      free_.pop_back();
    } else {
      if (allocated_ == chunks_.size() * rows_per_chunk()) {
        chunks_.emplace_back(new float[std::size_t(rows_per_chunk()) * stride_]);
        epochs_.resize(chunks_.size() * rows_per_chunk());
      }
      index = static_cast<uint32_t>(allocated_++);
    }
    epochs_[index] = checked(epoch);  // unpinned, no disk copy
    return index;
  }

  void release(uint32_t index) { free_.push_back(index); }

  // fn(index) for every live row (allocated, not released), in storage order: a pass over every
  // row reads the chunks in turn, where the handles of a key index would jump about them. fn must
  // not allocate or release rows (the rows visited are those live when the pass began).
  template <class Fn>
  void for_each_live(Fn&& fn) const {
    const uint32_t allocated = allocated_;
    const std::vector<bool> free = free_rows();
    for (uint32_t index = 0; index < allocated; ++index) {
      if (!free[index]) fn(index);
    }
  }

  // The first index compact() would move rows from (the fewest chunks that hold the live rows
  // end there), or kNoCompaction when no chunk would be freed.
  static constexpr uint32_t kNoCompaction = 0xffffffffu;
  uint32_t compact_boundary() const {
    const std::size_t needed = (live_rows() + rows_per_chunk() - 1) / rows_per_chunk();
    return chunks_.size() > needed ? static_cast<uint32_t>(needed * rows_per_chunk())
                                   : kNoCompaction;
  }
  // Released rows never free their chunk: this moves the live rows past compact_boundary() into
  // free rows below it (moved(from, to) for each, so that the caller re-points its index; flags
  // and epoch move along) and frees the chunks past it.
  template <class Moved>
  void compact(Moved&& moved) {
    const uint32_t boundary = compact_boundary();
    if (boundary == kNoCompaction) return;
    // allocated_ > boundary, and every index below it has been handed out: the free ones there
    // are at least as many as the live rows past it (boundary - live more).
    std::vector<bool> free = free_rows();
    uint32_t hole = 0;
    for (uint32_t from = boundary; from < allocated_; ++from) {
      if (free[from]) continue;
      while (!free[hole]) ++hole;
      std::memcpy(row(hole), row(from), sizeof(float) * stride_);
      epochs_[hole] = epochs_[from];
      free[hole] = false;
      moved(from, hole);
    }
    chunks_.resize(boundary / rows_per_chunk());
    epochs_.resize(boundary);
    epochs_.shrink_to_fit();
    std::vector<uint32_t> still_free;
    for (uint32_t index = hole; index < boundary; ++index) {
      if (free[index]) still_free.push_back(index);
    }
    free_.swap(still_free);
    allocated_ = boundary;
  }

  // Drops every row and gives the memory back.
  void clear() {
    chunks_.clear();
    epochs_.clear();
    free_.clear();
    epochs_.shrink_to_fit();
    free_.shrink_to_fit();
    allocated_ = 0;
  }

 private:
  // Whether each allocated index is free (released), by index.
  std::vector<bool> free_rows() const {
    std::vector<bool> free(allocated_, false);
    for (uint32_t index : free_) free[index] = true;
    return free;
  }

  static uint32_t log2_of(uint32_t rows_per_chunk) {
    uint32_t shift = 0;
    while ((uint32_t{1} << shift) < rows_per_chunk) ++shift;
    GPUBOX_EXPECTS((uint32_t{1} << shift) == rows_per_chunk && shift <= 30,
                   "row arena: rows per chunk must be a power of two, got ", rows_per_chunk);
    return shift;
  }

  static uint32_t checked(uint32_t epoch) {
    GPUBOX_EXPECTS((epoch & kFlagBits) == 0, "row arena: epoch ", epoch, " needs a flag bit");
    return epoch;
  }

  int32_t stride_;
  uint32_t chunk_shift_;
  std::vector<std::unique_ptr<float[]>> chunks_;
  std::vector<uint32_t> epochs_;
  std::vector<uint32_t> free_;
  std::size_t allocated_ = 0;
};

// One RowArena per width class (hyper_parameters.slot_dims), so that a row takes its own
// width's floats and not the widest's. A row is named by a handle: its class in the top
// kClassBits bits, its index in that class's arena below. With one class the handle is the
// index. Same contract as RowArena otherwise (not thread-safe; the shard's mutex guards it).
class RowArenas {
 public:
  static constexpr uint32_t kClassBits = 3;  // kMaxWidthClasses classes
  static constexpr uint32_t kClassShift = 32 - kClassBits;
  static constexpr uint32_t kIndexMask = (uint32_t{1} << kClassShift) - 1;
  static_assert((uint32_t{1} << kClassBits) >= static_cast<uint32_t>(kMaxWidthClasses));

  // `strides[c]`: floats per row of class c.
  RowArenas(const std::vector<int32_t>& strides, uint32_t rows_per_chunk) {
    GPUBOX_EXPECTS(!strides.empty() && strides.size() <= (std::size_t{1} << kClassBits),
                   "row arenas: ", strides.size(), " width classes");
    for (int32_t stride : strides) arenas_.emplace_back(stride, rows_per_chunk);
  }

  std::size_t classes() const { return arenas_.size(); }
  const RowArena& arena(std::size_t c) const { return arenas_[c]; }
  std::size_t live_rows() const {
    std::size_t rows = 0;
    for (const RowArena& a : arenas_) rows += a.live_rows();
    return rows;
  }
  std::size_t memory_bytes() const {
    std::size_t bytes = 0;
    for (const RowArena& a : arenas_) bytes += a.memory_bytes();
    return bytes;
  }
  // Floats and metadata of the live rows, each at its class's stride.
  std::size_t live_row_bytes() const {
    std::size_t bytes = 0;
    for (const RowArena& a : arenas_) {
      bytes += a.live_rows() * (sizeof(float) * a.stride() + RowArena::kMetadataBytes);
    }
    return bytes;
  }
  // Floats and metadata of the allocated chunks (what the rows take, free ones included).
  std::size_t allocated_row_bytes() const {
    std::size_t bytes = 0;
    for (const RowArena& a : arenas_) bytes += a.allocated_row_bytes();
    return bytes;
  }
  // Whether compact() would free a chunk, and the index in class c's arena it moves rows from.
  uint32_t compact_boundary(std::size_t c) const { return arenas_[c].compact_boundary(); }
  // RowArena::compact for every class; moved(from, to) with handles.
  template <class Moved>
  void compact(Moved&& moved) {
    for (uint32_t c = 0; c < arenas_.size(); ++c) {
      arenas_[c].compact([&](uint32_t from, uint32_t to) {
        moved((c << kClassShift) | from, (c << kClassShift) | to);
      });
    }
  }
  // Floats and metadata of the row at `handle`.
  std::size_t row_bytes(uint32_t handle) const {
    return sizeof(float) * stride(handle) + RowArena::kMetadataBytes;
  }
  static uint32_t class_of(uint32_t handle) { return handle >> kClassShift; }
  int32_t stride(uint32_t handle) const { return arenas_[class_of(handle)].stride(); }
  float* row(uint32_t handle) { return arenas_[class_of(handle)].row(handle & kIndexMask); }
  const float* row(uint32_t handle) const {
    return arenas_[class_of(handle)].row(handle & kIndexMask);
  }
  GPUBOX_FORCEINLINE void prefetch(uint32_t handle) const {
    arenas_[class_of(handle)].prefetch(handle & kIndexMask);
  }
  uint32_t epoch(uint32_t handle) const {
    return arenas_[class_of(handle)].epoch(handle & kIndexMask);
  }
  void set_epoch(uint32_t handle, uint32_t epoch) {
    arenas_[class_of(handle)].set_epoch(handle & kIndexMask, epoch);
  }
  bool pinned(uint32_t handle) const {
    return arenas_[class_of(handle)].pinned(handle & kIndexMask);
  }
  void set_pinned(uint32_t handle, bool pin) {
    arenas_[class_of(handle)].set_pinned(handle & kIndexMask, pin);
  }
  bool disk_copy(uint32_t handle) const {
    return arenas_[class_of(handle)].disk_copy(handle & kIndexMask);
  }
  bool disk_copy_clean(uint32_t handle) const {
    return arenas_[class_of(handle)].disk_copy_clean(handle & kIndexMask);
  }
  void set_disk_copy(uint32_t handle, bool clean) {
    arenas_[class_of(handle)].set_disk_copy(handle & kIndexMask, clean);
  }
  void clear_disk_copy(uint32_t handle) {
    arenas_[class_of(handle)].clear_disk_copy(handle & kIndexMask);
  }
  // A row of class `c` (contents unspecified until the caller writes them).
  uint32_t allocate(uint32_t c, uint32_t epoch) {
    const uint32_t index = arenas_[c].allocate(epoch);
    // kIndexMask itself stays unused: the top class's last index would read as kAbsent.
    GPUBOX_EXPECTS(index < kIndexMask, "row arenas: width class ", c, " is full (", index,
                   " rows in one shard; use more runner.host_table_shards)");
    return (c << kClassShift) | index;
  }
  void release(uint32_t handle) { arenas_[class_of(handle)].release(handle & kIndexMask); }
  // fn(handle) for every live row, class by class, each in storage order (RowArena::for_each_live).
  template <class Fn>
  void for_each_live(Fn&& fn) const {
    for (uint32_t c = 0; c < arenas_.size(); ++c) {
      arenas_[c].for_each_live([&](uint32_t index) { fn((c << kClassShift) | index); });
    }
  }
  void clear() {
    for (RowArena& a : arenas_) a.clear();
  }

 private:
  std::vector<RowArena> arenas_;
};

}  // namespace gpubox::table::detail
