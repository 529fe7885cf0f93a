// Segmented sums in one fixed order, cooperative on long segments: the reduction under HeterComm's
// local merge and owner merge, the slot pooling and the metrics sums. Portable device code
// (parallel_for functors); the cpu build runs exactly this code.
//
// A segment u is the positions [start[u], start[u+1]) of a Source; each of its `fields` columns is
// summed separately. The order of the additions is a function of the segment's length alone:
//
//   chunk length  Lu = max(kReduceChunk, ceil(sqrt(len)))
//   chunk k       C_k = v[b] + v[b+1] + ... (left to right), b = start + k * Lu
//   segment       sum = C_0 + C_1 + ... (left to right)
//
// so a segment of at most kReduceChunk values is summed strictly left to right (the order of the
// one-thread-per-segment loop this replaces), and a hot key with 10^4 occurrences becomes 100
// chunks of 100 summed in parallel, then 100 partials. Results are bit-identical whichever path
// computed them (sum_segment in one thread, or SegmentReducer's two passes), for any number of
// threads and on both backends (additions only: nothing to contract into an FMA).
//
//   sum_segment      one thread computes a whole segment (kernels that own no scratch: pooling).
//   SegmentReducer   one work item per (chunk, field) for the chunks of long segments, then
//                    one per (segment, field) adds its chunk partials (short segments: their
//                    values) in order. Parallel over fields too: on CUDA adjacent threads read
//                    adjacent floats of one record (coalesced); the cpu backend gives an item a
//                    group of fields instead (kDefaultFieldsPerItem), same additions. Scratch is
//                    owned and reused: in steady state a call allocates nothing, needs no host
//                    synchronization and no atomics.
//
// Source: trivially copyable, `using value_type = T;` and
//   GPUBOX_HD T value(position_t p, int32_t field) const;
// Sink: trivially copyable, GPUBOX_HD void operator()(std::size_t segment, int32_t field, T sum).
// Both may offer cpu-backend hooks (prefetch, row: see HasPrefetch below); OrderedRecords and
// RecordRows are the usual pair.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "common/error.hpp"
#include "common/macros.hpp"
#include "heterps/device/card.hpp"
#include "heterps/device/memory.hpp"
#include "heterps/device/parallel_for.cuh"
#include "heterps/heter_comm/segment_order.hpp"

namespace gpubox::heter_comm {

// The first partial slot of a long segment (len > kReduceChunk) starting at `start`. Slots of
// distinct long segments never overlap: a segment has at most ceil(len / kReduceChunk) <=
// floor(2 len / kReduceChunk) chunks, and the next segment starts len positions later.
GPUBOX_HD inline std::size_t reduce_first_slot(position_t start) {
  return 2 * static_cast<std::size_t>(start) / kReduceChunk;
}

// Partial slots needed for segments over `positions` positions.
inline std::size_t reduce_slot_count(std::size_t positions) {
  return 2 * positions / kReduceChunk + 1;
}

// Fields one work item of SegmentReducer sums. CUDA: one, so that neighbouring threads read
// neighbouring floats of a record (coalesced). cpu: a group (kFieldGroup, segment_order.hpp), so
// that a core walks a segment's records once for all of them instead of once per field. Each
// field's additions are the same either way, so the choice never changes a bit of the result.
#if defined(GPUBOX_BACKEND_CUDA)
inline constexpr int32_t kDefaultFieldsPerItem = 1;
#else
inline constexpr int32_t kDefaultFieldsPerItem = kFieldGroup;
#endif

// Optional cpu-backend hooks (detected, never required):
//   Source: void prefetch(position_t p) const   value(p, .) will be read soon
//   Sink:   T* row(std::size_t u) const         field f of segment u's sums lives at row(u)[f]
// With them a core sums a short segment in place, in the one-thread-per-segment loop's shape,
// with the records of a few segments ahead already requested: a per-segment loop that is not
// that short keeps too few records' cache misses in flight (measured: 1.6x slower).
template <class Source, class = void>
struct HasPrefetch : std::false_type {};
template <class Source>
struct HasPrefetch<Source,
                   std::void_t<decltype(std::declval<const Source&>().prefetch(position_t{}))>>
    : std::true_type {};
template <class Sink, class = void>
struct HasOutputRow : std::false_type {};
template <class Sink>
struct HasOutputRow<Sink, std::void_t<decltype(std::declval<const Sink&>().row(std::size_t{}))>>
    : std::true_type {};
inline constexpr std::size_t kPrefetchSegments = 8;
inline constexpr position_t kPrefetchPositions = 4;  // of the segment ahead

// The usual Sink: segment u's sums become record destination[u] (u when null) of `out`.
template <class T>
struct RecordRows {
  T* out;
  const position_t* destination;
  int32_t dim;
  GPUBOX_HD T* row(std::size_t u) const {
    const std::size_t to = destination != nullptr ? destination[u] : u;
    return out + to * static_cast<std::size_t>(dim);
  }
  GPUBOX_HD void operator()(std::size_t u, int32_t f, T sum) const { row(u)[f] = sum; }
};

inline constexpr position_t kNoSegment = ~position_t{0};

// Pass 0: each long segment names itself in its partial slots (the slots were set to kNoSegment).
struct MapChunkSlots {
  const position_t* start;
  position_t* slot_segment;
  GPUBOX_HD void operator()(std::size_t u) const {
    const position_t len = start[u + 1] - start[u];
    if (len <= kReduceChunk) return;
    const std::size_t first = reduce_first_slot(start[u]);
    const position_t chunks = reduce_chunk_count(len);
    for (position_t k = 0; k < chunks; ++k) slot_segment[first + k] = static_cast<position_t>(u);
  }
};

// Work item -> (row, first field, field count) for items of kGroup fields over `fields` fields.
template <int32_t kGroup>
struct FieldGroups {
  int32_t fields;
  GPUBOX_HD std::size_t groups() const { return (fields + kGroup - 1) / kGroup; }
  GPUBOX_HD std::size_t row(std::size_t item) const {
    return fields <= kGroup ? item : item / groups();  // no division in the common case
  }
  GPUBOX_HD int32_t first(std::size_t item) const {
    return fields <= kGroup ? 0 : static_cast<int32_t>(item % groups()) * kGroup;
  }
  GPUBOX_HD int32_t count(std::size_t item) const {
    const int32_t f = first(item);
    return fields - f < kGroup ? fields - f : kGroup;
  }
};

// Pass 1: one work item per (slot, field group) sums one chunk of a long segment.
template <int32_t kGroup, class Source>
struct SumChunks {
  Source source;
  const position_t* start;
  const position_t* slot_segment;
  typename Source::value_type* partials;
  FieldGroups<kGroup> groups;
  GPUBOX_HD void operator()(std::size_t item) const {
    const std::size_t slot = groups.row(item);
    const position_t u = slot_segment[slot];
    if (u == kNoSegment) return;
    const position_t begin = start[u];
    const position_t end = start[u + 1];
    const position_t chunk = reduce_chunk_length(end - begin);
    const position_t b = begin + static_cast<position_t>(slot - reduce_first_slot(begin)) * chunk;
    const int32_t field = groups.first(item);
    sum_chunk<kGroup>(source, b, end - b > chunk ? b + chunk : end, field, groups.count(item),
                      partials + slot * static_cast<std::size_t>(groups.fields) + field);
  }
};

// Pass 2: one work item per (segment, field group) adds the chunk partials (or, for a short
// segment, its values) in order and hands the sums to the sink.
template <int32_t kGroup, class Source, class Sink>
struct CombineChunks {
  Source source;
  Sink sink;
  const position_t* start;
  const typename Source::value_type* partials;
  FieldGroups<kGroup> groups;
  std::size_t segments;
  GPUBOX_HD void operator()(std::size_t item) const {
    const std::size_t u = groups.row(item);
    const int32_t field = groups.first(item);
    const int32_t count = groups.count(item);
    const position_t begin = start[u];
    const position_t end = start[u + 1];
#if !GPUBOX_ON_DEVICE
    if constexpr (HasPrefetch<Source>::value) {
      if (field == 0 && u + kPrefetchSegments < segments) {
        const position_t ahead = start[u + kPrefetchSegments];
        const position_t ahead_end = start[u + kPrefetchSegments + 1];
        for (position_t p = ahead; p < ahead_end && p < ahead + kPrefetchPositions; ++p) {
          source.prefetch(p);
        }
      }
    }
    if constexpr (HasOutputRow<Sink>::value) {
      if (end - begin <= kReduceChunk) {  // left to right, as sum_chunk: the same bits
        auto* out = sink.row(u) + field;
        for (int32_t j = 0; j < kGroup && j < count; ++j) {
          out[j] = begin < end ? source.value(begin, field + j) : typename Source::value_type{};
        }
        for (position_t p = begin + 1; p < end; ++p) {
          for (int32_t j = 0; j < kGroup && j < count; ++j) out[j] += source.value(p, field + j);
        }
        return;
      }
    }
#endif
    typename Source::value_type sums[kGroup] = {};
    if (end - begin <= kReduceChunk) {  // one chunk (or none): the common case
      sum_segment<kGroup>(source, begin, end, field, count, sums);
    } else {
      const std::size_t fields = static_cast<std::size_t>(groups.fields);
      const auto* first = partials + reduce_first_slot(begin) * fields + field;
      const position_t chunks = reduce_chunk_count(end - begin);
      for (int32_t j = 0; j < kGroup && j < count; ++j) sums[j] = first[j];
      for (position_t k = 1; k < chunks; ++k) {
        for (int32_t j = 0; j < kGroup && j < count; ++j) sums[j] += first[k * fields + j];
      }
    }
    for (int32_t j = 0; j < kGroup && j < count; ++j) sink(u, field + j, sums[j]);
  }
};

// start = {0, n}: the single segment of SegmentReducer::run_whole (a kernel argument type, so it
// lives at namespace scope: CUDA rejects private member types there).
struct WholeRange {
  position_t* start;
  position_t n;
  GPUBOX_HD void operator()(std::size_t i) const { start[i] = i == 0 ? 0 : n; }
};

// The two-pass engine with its reused scratch (partials and the slot -> segment map). One card
// thread drives it; calls are ordered on `stream`.
template <class T>
class SegmentReducer {
 public:
  // `fields_per_item`: 1 or kFieldGroup (see kDefaultFieldsPerItem); the results are the same.
  explicit SegmentReducer(device::Card& card, int32_t fields_per_item = kDefaultFieldsPerItem)
      : fields_per_item_(fields_per_item),
        slot_segment_(0, card.memory(), card.stream()),
        partials_(0, card.memory(), card.stream()),
        whole_(0, card.memory(), card.stream()) {
    GPUBOX_EXPECTS(fields_per_item == 1 || fields_per_item == kFieldGroup,
                   "segment reduce: fields per work item must be 1 or ", kFieldGroup, ", got ",
                   fields_per_item);
  }

  // For every segment u < segments and field f < fields: sink(u, f, sum of source.value(p, f)
  // over p in [start[u], start[u+1])) in the fixed order. `start` (card memory) has segments + 1
  // non-decreasing entries and start[segments] <= positions. Stream-ordered; no synchronization.
  template <class Source, class Sink>
  void run(const position_t* start, std::size_t segments, std::size_t positions, int32_t fields,
           const Source& source, const Sink& sink, const device::Stream& stream) {
    static_assert(std::is_same_v<typename Source::value_type, T>,
                  "partials hold the source's type");
    GPUBOX_EXPECTS(fields >= 0, "segment reduce: negative field count ", fields);
    if (segments == 0 || fields == 0) return;
    const std::size_t slots = reduce_slot_count(positions);
    slot_segment_.resize_discard(slots);
    partials_.resize_discard(slots * static_cast<std::size_t>(fields));
    device::memset_bytes_async(slot_segment_.data(), 0xff, slots * sizeof(position_t), stream);
    device::parallel_for(stream, segments, MapChunkSlots{start, slot_segment_.data()});
    if (fields_per_item_ == 1) {
      launch<1>(start, segments, slots, fields, source, sink, stream);
    } else {
      launch<kFieldGroup>(start, segments, slots, fields, source, sink, stream);
    }
  }

  // Sizes the scratch for run() over up to `positions` positions of `fields` fields, so a later
  // run() allocates nothing (device rule 1: no allocation once a step's collectives began).
  void reserve(std::size_t positions, int32_t fields) {
    const std::size_t slots = reduce_slot_count(positions);
    slot_segment_.reserve(slots);
    partials_.reserve(slots * static_cast<std::size_t>(fields < 0 ? 0 : fields));
  }

  // run() over one segment: positions [0, n).
  template <class Source, class Sink>
  void run_whole(std::size_t n, int32_t fields, const Source& source, const Sink& sink,
                 const device::Stream& stream) {
    GPUBOX_EXPECTS(n < (std::size_t{1} << 32), "segment reduce: ", n, " positions exceed 2^32");
    whole_.resize_discard(2);
    device::parallel_for(stream, 2, WholeRange{whole_.data(), static_cast<position_t>(n)});
    run(whole_.data(), 1, n, fields, source, sink, stream);
  }

  int32_t fields_per_item() const { return fields_per_item_; }
  // Card bytes of scratch held.
  std::size_t memory_bytes() const {
    return (slot_segment_.capacity() + whole_.capacity()) * sizeof(position_t) +
           partials_.capacity() * sizeof(T);
  }

 private:
  template <int32_t kGroup, class Source, class Sink>
  void launch(const position_t* start, std::size_t segments, std::size_t slots, int32_t fields,
              const Source& source, const Sink& sink, const device::Stream& stream) {
    const FieldGroups<kGroup> groups{fields};
    device::parallel_for(
        stream, slots * groups.groups(),
        SumChunks<kGroup, Source>{source, start, slot_segment_.data(), partials_.data(), groups});
    device::parallel_for(stream, segments * groups.groups(),
                         CombineChunks<kGroup, Source, Sink>{source, sink, start, partials_.data(),
                                                             groups, segments});
  }

  int32_t fields_per_item_;
  device::device_buffer<position_t> slot_segment_;
  device::device_buffer<T> partials_;
  device::device_buffer<position_t> whole_;  // {0, n} for run_whole
};

}  // namespace gpubox::heter_comm
