#include <thrust/copy.h>
#include <thrust/count.h>
#include <thrust/remove.h>

#include <algorithm>

#include "common/error.hpp"
#include "heterps/device/exec_policy.cuh"
#include "heterps/device/parallel_for.cuh"
#include "heterps/sparse/row_pool.hpp"

namespace gpubox::sparse {
namespace {

// free[i] = first + i.
struct FillIndices {
  row_index_t* free;
  row_index_t first;
  GPUBOX_HD void operator()(std::size_t i) const { free[i] = first + static_cast<row_index_t>(i); }
};

struct IsTaken {
  GPUBOX_HD bool operator()(uint8_t used) const { return used != 0; }
};

struct IsRow {
  GPUBOX_HD bool operator()(row_index_t row) const { return row != kInvalidRow; }
};

}  // namespace

RowPool::RowPool(device::Card& card, int32_t stride, std::size_t initial_rows)
    : card_(&card),
      stride_(stride),
      rows_(0, card.memory(), card.stream()),
      free_(0, card.memory(), card.stream()) {
  GPUBOX_EXPECTS(stride >= 0, "row stride must be >= 0, got ", stride);
  if (initial_rows > 0) grow_to(initial_rows, card.stream());
}

std::size_t RowPool::memory_bytes() const {
  return rows_.capacity() * sizeof(float) + free_.capacity() * sizeof(row_index_t);
}

void RowPool::grow_to(std::size_t new_capacity, const device::Stream& stream) {
  GPUBOX_EXPECTS(new_capacity <= kMaxRows, "card ", card_->rank(), ": row pool cannot hold ",
                 new_capacity, " rows (at most ", kMaxRows, ")");
  if (new_capacity <= capacity_) return;
  const std::size_t stride = static_cast<std::size_t>(stride_);
  if (stride > 0) {
    rows_.resize(new_capacity * stride);
    device::memset_bytes_async(rows_.data() + capacity_ * stride, 0,
                               (new_capacity - capacity_) * stride * sizeof(float), stream);
  }
  // The new rows join the free list above the rows that are free already.
  free_.resize(new_capacity);
  device::parallel_for(
      stream, new_capacity - capacity_,
      FillIndices{free_.data() + free_count_, static_cast<row_index_t>(capacity_)});
  free_count_ += new_capacity - capacity_;
  capacity_ = new_capacity;
}

void RowPool::reserve_free(std::size_t count, const device::Stream& stream) {
  if (free_count_ >= count) return;
  const std::size_t need = capacity_ + (count - free_count_);
  grow_to(std::min(kMaxRows, std::max(need, capacity_ + capacity_ / 2)), stream);
}

const row_index_t* RowPool::peek_free(std::size_t count) const {
  GPUBOX_EXPECTS(count <= free_count_, "row pool: ", count, " candidates asked, ", free_count_,
                 " rows free (reserve_free first)");
  return free_.data() + (free_count_ - count);
}

std::size_t RowPool::commit_allocation(const uint8_t* used, std::size_t count,
                                       const device::Stream& stream) {
  if (count == 0) return 0;
  GPUBOX_EXPECTS(count <= free_count_, "row pool: committing ", count, " candidates, ", free_count_,
                 " rows free");
  row_index_t* first = free_.data() + (free_count_ - count);
  // Common cases first: a batch of only new keys takes every candidate, a batch of only known
  // keys takes none; both need no compaction.
  const auto taken = static_cast<std::size_t>(
      thrust::count_if(device::exec_policy(stream), used, used + count, IsTaken{}));
  if (taken == count || taken == 0) {
    free_count_ -= taken;
    return taken;
  }
  // Stable: the untaken candidates keep their order at the top of the free list.
  row_index_t* kept_end =
      thrust::remove_if(device::exec_policy(stream), first, first + count, used, IsTaken{});
  GPUBOX_EXPECTS(static_cast<std::size_t>(kept_end - first) == count - taken,
                 "row pool: candidate flags changed during commit");
  free_count_ -= taken;
  return taken;
}

void RowPool::allocate(row_index_t* out, std::size_t count, const device::Stream& stream) {
  if (count == 0) return;
  reserve_free(count, stream);
  device::copy_async(out, free_.data() + (free_count_ - count), count, stream);
  free_count_ -= count;
}

std::size_t RowPool::release(const row_index_t* rows, std::size_t count,
                             const device::Stream& stream) {
  if (count == 0) return 0;
  // At most capacity_ - free_count_ rows are in use, so the appended ones fit in free_.
  row_index_t* first = free_.data() + free_count_;
  const std::size_t room = capacity_ - free_count_;
  if (count <= room) {
    row_index_t* end =
        thrust::copy_if(device::exec_policy(stream), rows, rows + count, first, IsRow{});
    free_count_ += static_cast<std::size_t>(end - first);
    return static_cast<std::size_t>(end - first);
  }
  // More entries than rows in use: some must be kInvalidRow; count first so nothing overflows.
  const auto freed = static_cast<std::size_t>(
      thrust::count_if(device::exec_policy(stream), rows, rows + count, IsRow{}));
  GPUBOX_EXPECTS(freed <= room, "row pool: releasing ", freed, " rows but only ", room,
                 " are in use");
  thrust::copy_if(device::exec_policy(stream), rows, rows + count, first, IsRow{});
  free_count_ += freed;
  return freed;
}

void RowPool::clear(const device::Stream& stream) {
  device::parallel_for(stream, capacity_, FillIndices{free_.data(), 0});
  free_count_ = capacity_;
}

}  // namespace gpubox::sparse
