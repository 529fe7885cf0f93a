// The card store's copies between a row pool and records of one stride (card_store.cu): a
// record holds its row's own fields and zeros past them (table::row_into_record), so records of
// every width share one stride. One thread per (record, field) on CUDA; the cpu backend takes a
// record's part at a time (run_range: one division, row look-up and width read per record).
// card_store_test checks both directions on every thread split against an oracle.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "common/macros.hpp"
#include "heterps/card_table/card_store.cuh"
#include "heterps/device/parallel_for.cuh"

namespace gpubox::card_table::detail {

// One thread per (record, field): field f of a record is the row's field f within the row's own
// stride, zero past it (table::row_into_record), so records of every width share one stride.
struct GatherRecords {
  RowPoolsRef pools;
  const row_index_t* rows;
  std::size_t count;  // rows
  float* out;
  int32_t record_stride;
  GPUBOX_HD void operator()(std::size_t item) const {
    const std::size_t stride = static_cast<std::size_t>(record_stride);
    const std::size_t r = item / stride;
    const row_index_t handle = rows[r];
    const auto f = static_cast<int32_t>(item % stride);
    if (f == 0 && r + kRowPrefetchDistance < count) pools.prefetch(rows[r + kRowPrefetchDistance]);
    out[item] = f < pools.stride(handle) ? pools.row(handle)[f] : 0.0f;
  }
#if !defined(GPUBOX_BACKEND_CUDA)
  // cpu: a record's fields in one call (one division, one row look-up and one read of the row's
  // width per record, not per field), the same values and prefetches as the per-field form.
  void run_range(std::size_t begin, std::size_t end) const {
    device::for_row_segments(begin, end, record_stride, [this](int64_t r, int64_t f0, int64_t f1) {
      const row_index_t handle = rows[r];
      if (f0 == 0 && static_cast<std::size_t>(r) + kRowPrefetchDistance < count) {
        pools.prefetch(rows[static_cast<std::size_t>(r) + kRowPrefetchDistance]);
      }
      float* record = out + r * record_stride;
      const int64_t own = std::clamp<int64_t>(pools.stride(handle), f0, f1);
      std::copy(pools.row(handle) + f0, pools.row(handle) + own, record + f0);
      std::fill(record + own, record + f1, 0.0f);
    });
  }
#endif
};

struct ScatterRecords {
  RowPoolsRef pools;
  const float* records;
  const row_index_t* rows;
  std::size_t count;  // rows
  int32_t record_stride;
  GPUBOX_HD void operator()(std::size_t item) const {
    const std::size_t stride = static_cast<std::size_t>(record_stride);
    const std::size_t r = item / stride;
    const row_index_t handle = rows[r];
    const auto f = static_cast<int32_t>(item % stride);
    if (f == 0 && r + kRowPrefetchDistance < count) {
      pools.prefetch</*kWrite=*/true>(rows[r + kRowPrefetchDistance]);
    }
    if (f < pools.stride(handle)) pools.row(handle)[f] = records[item];
  }
#if !defined(GPUBOX_BACKEND_CUDA)
  // cpu: a record's fields in one call (one division, one row look-up and one read of the row's
  // width per record, not per field), the same writes and prefetches as the per-field form.
  void run_range(std::size_t begin, std::size_t end) const {
    device::for_row_segments(begin, end, record_stride, [this](int64_t r, int64_t f0, int64_t f1) {
      const row_index_t handle = rows[r];
      if (f0 == 0 && static_cast<std::size_t>(r) + kRowPrefetchDistance < count) {
        pools.prefetch</*kWrite=*/true>(rows[static_cast<std::size_t>(r) + kRowPrefetchDistance]);
      }
      const float* record = records + r * record_stride;
      const int64_t own = std::clamp<int64_t>(pools.stride(handle), f0, f1);
      std::copy(record + f0, record + own, pools.row(handle) + f0);
    });
  }
#endif
};

}  // namespace gpubox::card_table::detail
