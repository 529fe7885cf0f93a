// Chunked, stable row storage for one host-tier shard: rows are `stride` floats each, allocated
// in chunks of rows_per_chunk (a power of two, kMaxRowsPerChunk unless a small memory budget
// asks for less, so that the last chunk's unused rows stay small beside it), and never move when
// the arena grows (an index stays valid until the row is released). The per-row modification epoch
// and pin flag sit in a parallel array (the pin in the epoch word's top bit: epochs count saves
// and stay below 2^31); the key does not (the shard's KeyIndexMap holds it: 8 bytes a row
// saved). Released indices are reused. Not thread-safe: the owning shard's mutex guards it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "common/error.hpp"

namespace gpubox::table::detail {

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
  // Bytes a row carries besides its floats (the modification epoch and the pin flag).
  static constexpr std::size_t kMetadataBytes = sizeof(uint32_t);
  static constexpr uint32_t kPinBit = uint32_t{1} << 31;

  uint32_t rows_per_chunk() const { return uint32_t{1} << chunk_shift_; }
  float* row(uint32_t index) {
    return chunks_[index >> chunk_shift_].get() +
           std::size_t(index & (rows_per_chunk() - 1)) * stride_;
  }
  const float* row(uint32_t index) const {
    return chunks_[index >> chunk_shift_].get() +
           std::size_t(index & (rows_per_chunk() - 1)) * stride_;
  }
  void prefetch(uint32_t index) const { __builtin_prefetch(row(index)); }
  uint32_t epoch(uint32_t index) const { return epochs_[index] & ~kPinBit; }
  void set_epoch(uint32_t index, uint32_t epoch) {
    epochs_[index] = (epochs_[index] & kPinBit) | checked(epoch);
  }
  // A pinned row belongs to a pass in flight (pulled, not yet written back); eviction takes
  // unpinned rows first.
  bool pinned(uint32_t index) const { return (epochs_[index] & kPinBit) != 0; }
  void set_pinned(uint32_t index, bool pin) {
    epochs_[index] = pin ? epochs_[index] | kPinBit : epochs_[index] & ~kPinBit;
  }

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
    epochs_[index] = checked(epoch);  // unpinned
    return index;
  }

  void release(uint32_t index) { free_.push_back(index); }

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
  static uint32_t log2_of(uint32_t rows_per_chunk) {
    uint32_t shift = 0;
    while ((uint32_t{1} << shift) < rows_per_chunk) ++shift;
    GPUBOX_EXPECTS((uint32_t{1} << shift) == rows_per_chunk && shift <= 30,
                   "row arena: rows per chunk must be a power of two, got ", rows_per_chunk);
    return shift;
  }

  static uint32_t checked(uint32_t epoch) {
    GPUBOX_EXPECTS((epoch & kPinBit) == 0, "row arena: epoch ", epoch, " needs the pin bit");
    return epoch;
  }

  int32_t stride_;
  uint32_t chunk_shift_;
  std::vector<std::unique_ptr<float[]>> chunks_;
  std::vector<uint32_t> epochs_;
  std::vector<uint32_t> free_;
  std::size_t allocated_ = 0;
};

}  // namespace gpubox::table::detail
