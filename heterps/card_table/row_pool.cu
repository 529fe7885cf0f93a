#include <thrust/copy.h>
#include <thrust/count.h>
#include <thrust/remove.h>

#include <algorithm>

#include "common/error.hpp"
#include "heterps/card_table/row_pool.hpp"
#include "heterps/device/exec_policy.cuh"
#include "heterps/device/parallel_for.cuh"

namespace gpubox::card_table {
namespace {

// free[i] = first + i (the handles of consecutive rows).
struct FillIndices {
  row_index_t* free;
  row_index_t first;
  GPUBOX_HD void operator()(std::size_t i) const { free[i] = first + static_cast<row_index_t>(i); }
};

struct IsTaken {
  GPUBOX_HD bool operator()(uint8_t used) const { return used != 0; }
};

// A row of pool `pool` (not kInvalidRow, not another pool's handle).
struct IsRow {
  RowHandleCodec codec;
  int32_t pool;
  GPUBOX_HD bool operator()(row_index_t row) const {
    return row != kInvalidRow && codec.pool_of(row) == pool;
  }
};

// page_table[index] = page (the pointer travels by value: no host buffer to keep alive).
struct SetPage {
  float** page_table;
  std::size_t index;
  float* page;
  GPUBOX_HD void operator()(std::size_t) const { page_table[index] = page; }
};

// One thread per (row, field): neighbouring threads touch neighbouring floats.
struct GatherRows {
  RowPagesRef pages;
  const row_index_t* rows;
  float* out;
  GPUBOX_HD void operator()(std::size_t item) const {
    const std::size_t stride = static_cast<std::size_t>(pages.stride);
    out[item] = pages.row(rows[item / stride])[item % stride];
  }
};

struct ScatterRows {
  RowPagesRef pages;
  const float* src;
  const row_index_t* rows;
  GPUBOX_HD void operator()(std::size_t item) const {
    const std::size_t stride = static_cast<std::size_t>(pages.stride);
    pages.row(rows[item / stride])[item % stride] = src[item];
  }
};

// A handle whose index is at or above `first_row`.
struct IsAtOrAbove {
  row_index_t index_mask;
  std::size_t first_row;
  GPUBOX_HD bool operator()(row_index_t handle) const {
    return static_cast<std::size_t>(handle & index_mask) >= first_row;
  }
};

uint32_t log2_exact(std::size_t page_rows) {
  GPUBOX_EXPECTS(page_rows > 0 && (page_rows & (page_rows - 1)) == 0,
                 "row pool: rows per page must be a power of two, got ", page_rows);
  uint32_t shift = 0;
  while ((std::size_t{1} << shift) < page_rows) ++shift;
  return shift;
}

}  // namespace

RowPool::RowPool(device::Card& card, int32_t stride, std::size_t initial_rows,
                 std::size_t page_rows, RowHandleCodec codec, int32_t pool)
    : card_(&card),
      stride_(stride),
      codec_(codec),
      pool_(pool),
      page_shift_(log2_exact(page_rows == 0 ? page_rows_for(stride) : page_rows)),
      page_table_(0, card.memory(), card.stream()),
      free_(0, card.memory(), card.stream()) {
  GPUBOX_EXPECTS(stride >= 0, "row stride must be >= 0, got ", stride);
  GPUBOX_EXPECTS(pool >= 0 && codec.pool_of(codec.first_handle(pool)) == pool &&
                     codec.first_handle(pool) != kInvalidRow,
                 "row pool ", pool, " has no handles with ", codec.index_bits, " index bits");
  reserve_free(initial_rows, card.stream());
}

std::size_t RowPool::memory_bytes() const {
  return pages_.size() * page_bytes() + page_table_.capacity() * sizeof(float*) +
         free_.capacity() * sizeof(row_index_t);
}

void RowPool::add_pages(std::size_t count, const device::Stream& stream) {
  const std::size_t new_capacity = capacity_ + count * page_rows();
  GPUBOX_EXPECTS(new_capacity <= codec_.max_rows(), "card ", card_->rank(), ": row pool ", pool_,
                 " (rows of ", stride_, " floats) cannot hold ", new_capacity, " rows (at most ",
                 codec_.max_rows(), ")");
  if (stride_ > 0) {
    page_table_.resize(pages_.size() + count);  // a few pointers: the only thing ever copied
    for (std::size_t p = 0; p < count; ++p) {
      // Read at random for the pool's life: on huge pages (device::Pages).
      device::device_buffer<float> page(page_rows() * static_cast<std::size_t>(stride_),
                                        card_->memory(), card_->stream(), device::Pages::kHuge);
      device::memset_bytes_async(page.data(), 0, page.bytes(), stream);
      device::parallel_for(stream, 1, SetPage{page_table_.data(), pages_.size(), page.data()});
      pages_.push_back(std::move(page));
    }
  }
  // The new rows join the free list above the rows that are free already.
  free_.resize(new_capacity);
  device::parallel_for(
      stream, new_capacity - capacity_,
      FillIndices{free_.data() + free_count_,
                  codec_.first_handle(pool_) | static_cast<row_index_t>(capacity_)});
  free_count_ += new_capacity - capacity_;
  capacity_ = new_capacity;
}

void RowPool::reserve_free(std::size_t count, const device::Stream& stream) {
  if (free_count_ >= count) return;
  const std::size_t missing = count - free_count_;
  add_pages((missing + page_rows() - 1) / page_rows(), stream);
}

void RowPool::reserve_index(std::size_t rows) {
  GPUBOX_EXPECTS(rows <= codec_.max_rows(), "card ", card_->rank(), ": row pool ", pool_,
                 " cannot hold ", rows, " rows (at most ", codec_.max_rows(), ")");
  const std::size_t pages = (rows + page_rows() - 1) / page_rows();
  free_.reserve(pages * page_rows());
  if (stride_ > 0) page_table_.reserve(pages);
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

void RowPool::take_free(std::size_t count) {
  GPUBOX_EXPECTS(count <= free_count_, "row pool: taking ", count, " candidates, ", free_count_,
                 " rows free");
  free_count_ -= count;
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
    row_index_t* end = thrust::copy_if(device::exec_policy(stream), rows, rows + count, first,
                                       IsRow{codec_, pool_});
    free_count_ += static_cast<std::size_t>(end - first);
    return static_cast<std::size_t>(end - first);
  }
  // More entries than rows in use: some must be skipped; count first so nothing overflows.
  const auto freed = static_cast<std::size_t>(
      thrust::count_if(device::exec_policy(stream), rows, rows + count, IsRow{codec_, pool_}));
  GPUBOX_EXPECTS(freed <= room, "row pool: releasing ", freed, " rows but only ", room,
                 " are in use");
  thrust::copy_if(device::exec_policy(stream), rows, rows + count, first, IsRow{codec_, pool_});
  free_count_ += freed;
  return freed;
}

row_index_t* RowPool::append_free(std::size_t count) {
  GPUBOX_EXPECTS(count <= capacity_ - free_count_, "row pool: releasing ", count, " rows but only ",
                 capacity_ - free_count_, " are in use");
  row_index_t* tail = free_.data() + free_count_;
  free_count_ += count;
  return tail;
}

void RowPool::clear(const device::Stream& stream) {
  device::parallel_for(stream, capacity_, FillIndices{free_.data(), codec_.first_handle(pool_)});
  free_count_ = capacity_;
}

std::size_t RowPool::withhold_free_from(std::size_t first_row, const device::Stream& stream) {
  row_index_t* first = free_.data();
  row_index_t* kept_end = device::host_result(stream, [&] {
    return thrust::remove_if(device::exec_policy(stream), first, first + free_count_,
                             IsAtOrAbove{codec_.index_mask(), first_row});
  });
  const std::size_t withheld = free_count_ - static_cast<std::size_t>(kept_end - first);
  free_count_ -= withheld;
  return withheld;
}

void RowPool::drop_pages_from(std::size_t rows, const device::Stream& stream) {
  GPUBOX_EXPECTS(rows % page_rows() == 0 && rows <= capacity_, "row pool: cannot shrink ",
                 capacity_, " rows to ", rows, " (pages of ", page_rows(), ")");
  GPUBOX_EXPECTS(free_count_ <= rows, "row pool: ", free_count_, " rows on the free list, ", rows,
                 " kept: the rows above were not withheld");
  if (stride_ > 0) {
    // No kernel may still use the pages: they are freed on the card's stream (stream-ordered, as
    // cudaFreeAsync is), after its work; work on another stream is waited for.
    if (&stream != &card_->stream()) stream.synchronize();
    pages_.resize(rows / page_rows());
    page_table_.resize(pages_.size());
  }
  capacity_ = rows;
}

void RowPool::gather(const row_index_t* rows, std::size_t n, float* out,
                     const device::Stream& stream) const {
  if (stride_ == 0) return;
  device::parallel_for(stream, n * static_cast<std::size_t>(stride_),
                       GatherRows{this->rows(), rows, out});
}

void RowPool::scatter(const float* src, const row_index_t* rows, std::size_t n,
                      const device::Stream& stream) {
  if (stride_ == 0) return;
  device::parallel_for(stream, n * static_cast<std::size_t>(stride_),
                       ScatterRows{this->rows(), src, rows});
}

}  // namespace gpubox::card_table
