// The fixed order of segment_reduce.cuh's segmented sums, as plain functions any thread (card or
// host) runs: the chunk lengths, sum_segment (one thread sums a segment), OrderedRecords (the
// usual source: records taken in a given order) and sum_segments (every segment of a range on
// the calling host thread). Host code that must give the bits a card's merge gives includes this
// header, not the device one: the PS modes' per-key merge of a batch's pushes
// (trainer/ps_modes/ps_worker.cpp) sums each key's occurrences as HeterComm's local merge does,
// so that the sync mode with one thread computes the gpubox mode's model on one card bit for bit.
// The order and the Source concept: segment_reduce.cuh.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/macros.hpp"

namespace gpubox::heter_comm {

using position_t = uint32_t;

// Shortest chunk; segments up to this length are summed left to right by one thread.
inline constexpr position_t kReduceChunk = 32;

// Fields one thread sums together when it walks a segment's records once for all of them (the
// cpu backend's SegmentReducer work item, sum_segments). Each field's additions are its own, so
// the grouping never changes a bit.
inline constexpr int32_t kFieldGroup = 16;

// ceil(sqrt(x)) in integers (the same on host and card).
GPUBOX_HD inline position_t ceil_sqrt(position_t x) {
  if (x <= 1) return x;
  // Newton from above on the floor root, then round up.
  uint64_t r = x;
  uint64_t next = (r + 1) / 2;
  while (next < r) {
    r = next;
    next = (r + x / r) / 2;
  }
  return static_cast<position_t>(r * r < x ? r + 1 : r);
}

// The chunk length Lu of a segment of `len` values (segment_reduce.cuh).
GPUBOX_HD inline position_t reduce_chunk_length(position_t len) {
  if (len <= kReduceChunk * kReduceChunk) return kReduceChunk;
  return ceil_sqrt(len);
}

// Chunks of a segment of `len` values (0 for an empty one).
GPUBOX_HD inline position_t reduce_chunk_count(position_t len) {
  const position_t chunk = reduce_chunk_length(len);
  return (len + chunk - 1) / chunk;
}

// Chunk C_k (segment_reduce.cuh) for fields [field, field + count), count <= kGroup: sums[j] =
// values [begin, end) of field + j, left to right. Requires begin < end.
template <int32_t kGroup, class Source>
GPUBOX_HD GPUBOX_FORCEINLINE void sum_chunk(const Source& source, position_t begin, position_t end,
                                            int32_t field, int32_t count,
                                            typename Source::value_type* sums) {
  using T = typename Source::value_type;
  // Local accumulators, written out once. They start at -0, the additive identity that keeps
  // every bit (-0 + x == x, also for x = +0 or -0): the first value is added, not copied (a copy
  // loop becomes a memcpy call per record on the cpu backend). All kGroup of them are set, as
  // whole registers, so vectorized additions read them back without a store-forwarding stall.
  T acc[kGroup];
  const int32_t n = count < kGroup ? count : kGroup;
  for (int32_t j = 0; j < kGroup; ++j) acc[j] = static_cast<T>(-0.0);
  for (position_t p = begin; p < end; ++p) {
    for (int32_t j = 0; j < n; ++j) acc[j] += source.value(p, field + j);
  }
  for (int32_t j = 0; j < n; ++j) sums[j] = acc[j];
}

// Fields [field, field + count) of the segment [begin, end) in the fixed order, by one thread
// (zeros when empty); count <= kGroup.
template <int32_t kGroup, class Source>
GPUBOX_HD GPUBOX_FORCEINLINE void sum_segment(const Source& source, position_t begin,
                                              position_t end, int32_t field, int32_t count,
                                              typename Source::value_type* sums) {
  using T = typename Source::value_type;
  if (begin >= end) {
    for (int32_t j = 0; j < kGroup && j < count; ++j) sums[j] = T{};
    return;
  }
  const position_t chunk = reduce_chunk_length(end - begin);
  const position_t first_end = end - begin > chunk ? begin + chunk : end;
  sum_chunk<kGroup>(source, begin, first_end, field, count, sums);
  for (position_t b = first_end; b < end; b += chunk) {
    T partial[kGroup];
    sum_chunk<kGroup>(source, b, end - b > chunk ? b + chunk : end, field, count, partial);
    for (int32_t j = 0; j < kGroup && j < count; ++j) sums[j] += partial[j];
  }
}

// One field of the segment [begin, end) in the fixed order, by one thread (zero when empty).
template <class Source>
GPUBOX_HD typename Source::value_type sum_segment(const Source& source, position_t begin,
                                                  position_t end, int32_t field) {
  typename Source::value_type sum[1];
  sum_segment<1>(source, begin, end, field, 1, sum);
  return sum[0];
}

// The usual Source: field f of record order[p] of `records` (rows of `dim` values), e.g. the
// records of a key's occurrences taken in key order. Takes prefetch hints.
template <class T>
struct OrderedRecords {
  using value_type = T;
  const T* records;
  const position_t* order;
  int32_t dim;
  GPUBOX_HD T value(position_t p, int32_t f) const {
    return records[static_cast<std::size_t>(order[p]) * static_cast<std::size_t>(dim) + f];
  }
  GPUBOX_HD void prefetch(position_t p) const {
#if !GPUBOX_ON_DEVICE
    __builtin_prefetch(records +
                       static_cast<std::size_t>(order[p]) * static_cast<std::size_t>(dim));
#else
    (void)p;
#endif
  }
};

// Every field f < fields of the segment [begin, end): row[f] = the sum of source.value(p, f), in
// the fixed order, on the calling thread (kFieldGroup fields at a time).
template <class Source>
void sum_segment_row(const Source& source, position_t begin, position_t end, int32_t fields,
                     typename Source::value_type* row) {
  for (int32_t f = 0; f < fields; f += kFieldGroup) {
    sum_segment<kFieldGroup>(source, begin, end, f,
                             fields - f < kFieldGroup ? fields - f : kFieldGroup, row + f);
  }
}

// Every segment u < segments and field f < fields: out[u * fields + f] = the sum of
// source.value(p, f) over p in [start[u], start[u + 1]), in the fixed order, on the calling
// thread: the bits SegmentReducer::run gives. `start` holds segments + 1 non-decreasing entries.
template <class Source>
void sum_segments(const Source& source, const position_t* start, std::size_t segments,
                  int32_t fields, typename Source::value_type* out) {
  for (std::size_t u = 0; u < segments; ++u) {
    sum_segment_row(source, start[u], start[u + 1], fields,
                    out + u * static_cast<std::size_t>(fields));
  }
}

}  // namespace gpubox::heter_comm
