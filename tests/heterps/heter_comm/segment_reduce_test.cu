// SegmentReducer and sum_segment (heterps/heter_comm/segment_reduce.cuh) on Zipf-skewed
// segments: against a float64 oracle (tolerance), against the one-thread left-to-right loop they
// replace (bit for bit where the order is that loop's: segments of at most kReduceChunk values),
// and against an independent host model of the chunked order (bit for bit, every segment), with
// 1 and 2 threads per card, one field or a group of fields per work item, through both the
// two-pass engine and the one-thread path, and the host's sum_segments (segment_order.hpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "common/error.hpp"
#include "heterps/device/card.hpp"
#include "heterps/device/memory.hpp"
#include "heterps/device/parallel_for.cuh"
#include "heterps/heter_comm/segment_reduce.cuh"

namespace gpubox::heter_comm::detail {
namespace {

using device::CardSet;
using device::to_device;
using device::to_host;

// HeterComm's source and sink (records in key order, one record per segment) without their
// optional cpu hooks, so that the engine's generic path runs too.
struct Gathered {
  using value_type = float;
  OrderedRecords<float> records;
  GPUBOX_HD float value(position_t p, int32_t f) const { return records.value(p, f); }
};
struct Scattered {
  RecordRows<float> rows;
  GPUBOX_HD void operator()(std::size_t u, int32_t f, float sum) const { rows(u, f, sum); }
};
static_assert(HasPrefetch<OrderedRecords<float>>::value && HasOutputRow<RecordRows<float>>::value);
static_assert(!HasPrefetch<Gathered>::value && !HasOutputRow<Scattered>::value);

// The one-thread path over every (segment, field).
struct OneThreadPerSegment {
  Gathered source;
  Scattered sink;
  const position_t* start;
  GPUBOX_HD void operator()(std::size_t item) const {
    const std::size_t u = item / source.records.dim;
    const int32_t f = static_cast<int32_t>(item % source.records.dim);
    sink(u, f, sum_segment(source, start[u], start[u + 1], f));
  }
};

struct Problem {
  std::vector<position_t> start;        // segments + 1
  std::vector<position_t> order;        // position -> value row (a permutation)
  std::vector<position_t> destination;  // segment -> output row (a permutation)
  std::vector<float> values;            // rows x fields
  int32_t fields = 0;
  std::size_t segments() const { return start.size() - 1; }
  std::size_t positions() const { return start.back(); }
  float value(position_t p, int32_t f) const {
    return values[static_cast<std::size_t>(order[p]) * fields + f];
  }
};

// Segment lengths: Zipf counts of `draws` occurrences over `keys` keys (the hottest key gets
// thousands; keys never drawn give empty segments), then every length around the chunk lengths.
Problem make_problem(uint64_t seed, int32_t fields, std::size_t draws, std::size_t keys) {
  std::mt19937_64 rng(seed);
  std::vector<double> cdf(keys);
  double total = 0;
  for (std::size_t i = 0; i < keys; ++i) cdf[i] = total += 1.0 / std::pow(double(i + 1), 1.1);
  std::vector<position_t> counts(keys, 0);
  std::uniform_real_distribution<double> unit(0.0, total);
  for (std::size_t d = 0; d < draws; ++d) {
    const auto rank = std::lower_bound(cdf.begin(), cdf.end(), unit(rng)) - cdf.begin();
    ++counts[std::min<std::size_t>(rank, keys - 1)];
  }
  for (position_t len : {0u, 1u, 2u, 31u, 32u, 33u, 63u, 64u, 65u, 1023u, 1024u, 1025u, 1089u,
                         1090u, 4097u, 0u, 1u}) {
    counts.push_back(len);
  }
  std::shuffle(counts.begin(), counts.end(), rng);
  Problem p;
  p.fields = fields;
  p.start.push_back(0);
  for (position_t c : counts) p.start.push_back(p.start.back() + c);
  p.order.resize(p.positions());
  std::iota(p.order.begin(), p.order.end(), position_t{0});
  std::shuffle(p.order.begin(), p.order.end(), rng);
  p.destination.resize(p.segments());
  std::iota(p.destination.begin(), p.destination.end(), position_t{0});
  std::shuffle(p.destination.begin(), p.destination.end(), rng);
  // Mixed signs and magnitudes: rounding differs visibly between summation orders.
  std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-8, 8);
  p.values.resize(p.positions() * fields);
  for (float& v : p.values) v = std::ldexp(mantissa(rng), exponent(rng));
  return p;
}

// A Problem's arrays in one card's memory, and the output (NaN until written).
struct OnCard {
  OnCard(const Problem& p, device::Card& card)
      : start(to_device(p.start, card.memory(), card.stream())),
        order(to_device(p.order, card.memory(), card.stream())),
        destination(to_device(p.destination, card.memory(), card.stream())),
        values(to_device(p.values, card.memory(), card.stream())),
        out(card.make_buffer<float>(p.segments() * p.fields)),
        fields(p.fields) {
    device::memset_bytes_async(out.data(), 0xff, out.bytes(), card.stream());
  }
  OrderedRecords<float> source() const { return {values.data(), order.data(), fields}; }
  RecordRows<float> sink() { return {out.data(), destination.data(), fields}; }
  device::device_buffer<position_t> start, order, destination;
  device::device_buffer<float> values, out;
  int32_t fields;
};

// Runs the engine (two_pass, with `fields_per_item` fields per work item, through the optional
// cpu hooks when `hooks`) or the one-thread path on a card with `threads` threads.
std::vector<float> reduce_on_card(const Problem& p, int threads, bool two_pass,
                                  int32_t fields_per_item = kDefaultFieldsPerItem,
                                  bool hooks = false) {
  CardSet cards = CardSet::from_list("0", 0, 1, threads);
  device::Card& card = cards.card(0);
  card.activate();
  const auto& stream = card.stream();
  OnCard d(p, card);
  if (!two_pass) {
    device::parallel_for(stream, p.segments() * p.fields,
                         OneThreadPerSegment{{d.source()}, {d.sink()}, d.start.data()});
  } else if (hooks) {
    SegmentReducer<float>(card, fields_per_item)
        .run(d.start.data(), p.segments(), p.positions(), p.fields, d.source(), d.sink(), stream);
  } else {
    SegmentReducer<float>(card, fields_per_item)
        .run(d.start.data(), p.segments(), p.positions(), p.fields, Gathered{d.source()},
             Scattered{d.sink()}, stream);
  }
  return to_host(d.out);
}

// The order as the header documents it, written out independently of the header's code.
float documented_order(const Problem& p, std::size_t u, int32_t f) {
  const position_t begin = p.start[u];
  const position_t len = p.start[u + 1] - begin;
  if (len == 0) return 0.0f;
  position_t chunk = 32;
  while (static_cast<uint64_t>(chunk) * chunk < len) ++chunk;  // max(32, ceil(sqrt(len)))
  float sum = 0.0f;
  for (position_t b = 0; b < len; b += chunk) {
    float partial = p.value(begin + b, f);
    for (position_t j = b + 1; j < std::min(len, b + chunk); ++j) partial += p.value(begin + j, f);
    sum = b == 0 ? partial : sum + partial;
  }
  return sum;
}

// The loop the engine replaced: one thread, left to right.
float left_to_right(const Problem& p, std::size_t u, int32_t f) {
  const position_t begin = p.start[u];
  const position_t end = p.start[u + 1];
  if (begin == end) return 0.0f;
  float sum = p.value(begin, f);
  for (position_t j = begin + 1; j < end; ++j) sum += p.value(j, f);
  return sum;
}

uint32_t bits(float v) {
  uint32_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
}

TEST(SegmentReduce, ChunkArithmetic) {
  for (uint32_t x = 0; x < 200000; ++x) {
    const uint32_t r = ceil_sqrt(x);
    ASSERT_GE(uint64_t{r} * r, x) << x;
    if (r > 0) {
      ASSERT_LT(uint64_t{r - 1} * (r - 1), x) << x;
    }
  }
  EXPECT_EQ(ceil_sqrt(0xffffffffu), 65536u);
  EXPECT_EQ(reduce_chunk_count(0), 0u);
  EXPECT_EQ(reduce_chunk_count(1), 1u);
  EXPECT_EQ(reduce_chunk_count(32), 1u);
  EXPECT_EQ(reduce_chunk_count(33), 2u);
  EXPECT_EQ(reduce_chunk_count(1024), 32u);
  EXPECT_EQ(reduce_chunk_length(10000), 100u);
  EXPECT_EQ(reduce_chunk_length(1024), 32u);
  EXPECT_EQ(reduce_chunk_length(1025), 33u);
  EXPECT_EQ(reduce_chunk_count(10000), 100u);
  // Partial slots of long segments never overlap and fit in reduce_slot_count, for every pair of
  // neighbouring long segments at every offset inside a chunk.
  for (position_t start = 0; start < 200; ++start) {
    for (position_t len = kReduceChunk + 1; len < 300; ++len) {
      const std::size_t last = reduce_first_slot(start) + reduce_chunk_count(len) - 1;
      ASSERT_LT(last, reduce_first_slot(start + len)) << start << " " << len;
      ASSERT_LT(last, reduce_slot_count(start + len)) << start << " " << len;
    }
  }
}

class SegmentReduceTest : public ::testing::TestWithParam<int32_t> {};

TEST_P(SegmentReduceTest, ZipfSegmentsMatchOracleAndFixedOrderOnEveryPath) {
  const int32_t fields = GetParam();
  const Problem p = make_problem(17 + fields, fields, /*draws=*/120000, /*keys=*/3000);
  position_t longest = 0;
  std::size_t ones = 0;
  std::size_t empties = 0;
  for (std::size_t u = 0; u < p.segments(); ++u) {
    const position_t len = p.start[u + 1] - p.start[u];
    longest = std::max(longest, len);
    ones += len == 1;
    empties += len == 0;
  }
  ASSERT_GE(longest, 10000u) << "the hottest key should have 10^4+ occurrences";
  ASSERT_GE(ones, 100u);
  ASSERT_GE(empties, 2u);

  const auto engine_1 = reduce_on_card(p, 1, /*two_pass=*/true, /*fields_per_item=*/1);
  const auto engine_2 = reduce_on_card(p, 2, /*two_pass=*/true, /*fields_per_item=*/1);
  const auto grouped_1 = reduce_on_card(p, 1, /*two_pass=*/true, kFieldGroup);
  const auto grouped_2 = reduce_on_card(p, 2, /*two_pass=*/true, kFieldGroup);
  const auto hooked_1 = reduce_on_card(p, 1, /*two_pass=*/true, kFieldGroup, /*hooks=*/true);
  const auto hooked_2 = reduce_on_card(p, 2, /*two_pass=*/true, 1, /*hooks=*/true);
  const auto one_thread_1 = reduce_on_card(p, 1, /*two_pass=*/false);
  const auto one_thread_2 = reduce_on_card(p, 2, /*two_pass=*/false);
  // The host's sum_segments (segment_order.hpp: a PS thread's per-key merge of its pushes).
  std::vector<float> host(p.segments() * fields);
  sum_segments(OrderedRecords<float>{p.values.data(), p.order.data(), fields}, p.start.data(),
               p.segments(), fields, host.data());
  std::size_t checked_left_to_right = 0;
  for (std::size_t u = 0; u < p.segments(); ++u) {
    const position_t len = p.start[u + 1] - p.start[u];
    for (int32_t f = 0; f < fields; ++f) {
      const std::size_t at = static_cast<std::size_t>(p.destination[u]) * fields + f;
      const float got = engine_1[at];
      SCOPED_TRACE(testing::Message()
                   << "segment " << u << " of length " << len << ", field " << f);
      // Every path, every thread count: the same bits, and the documented order's bits.
      ASSERT_EQ(bits(got), bits(engine_2[at]));
      ASSERT_EQ(bits(got), bits(grouped_1[at]));
      ASSERT_EQ(bits(got), bits(grouped_2[at]));
      ASSERT_EQ(bits(got), bits(hooked_1[at]));
      ASSERT_EQ(bits(got), bits(hooked_2[at]));
      ASSERT_EQ(bits(got), bits(one_thread_1[at]));
      ASSERT_EQ(bits(got), bits(one_thread_2[at]));
      ASSERT_EQ(bits(got), bits(host[u * fields + f]));
      ASSERT_EQ(bits(got), bits(documented_order(p, u, f)));
      // Short segments: exactly the old left-to-right loop.
      if (len <= kReduceChunk) {
        ASSERT_EQ(bits(got), bits(left_to_right(p, u, f)));
        ++checked_left_to_right;
      }
      // float64 oracle: the error of any summation order is bounded by len * eps * sum |v|.
      double exact = 0;
      double magnitude = 0;
      for (position_t j = p.start[u]; j < p.start[u + 1]; ++j) {
        exact += p.value(j, f);
        magnitude += std::fabs(p.value(j, f));
      }
      ASSERT_LE(std::fabs(got - exact), 1e-7 * (len + 1) * magnitude + 1e-30) << exact;
    }
  }
  EXPECT_GT(checked_left_to_right, p.segments() / 2);
}

INSTANTIATE_TEST_SUITE_P(Fields, SegmentReduceTest, ::testing::Values(1, 3, 11, 20));

// The chunked order is also more accurate than left to right on a long segment of same-sign
// values (the running sum grows; chunk partials stay small).
TEST(SegmentReduce, LongSegmentIsMoreAccurateThanLeftToRight) {
  Problem p;
  p.fields = 1;
  const position_t n = 1 << 20;
  p.start = {0, n};
  p.order.resize(n);
  std::iota(p.order.begin(), p.order.end(), position_t{0});
  p.destination = {0};
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> value(0.5f, 1.5f);
  p.values.resize(n);
  double exact = 0;
  for (float& v : p.values) exact += v = value(rng);
  const float chunked = reduce_on_card(p, 2, true)[0];
  const float serial = left_to_right(p, 0, 0);
  EXPECT_LT(std::fabs(chunked - exact), std::fabs(serial - exact));
  EXPECT_LT(std::fabs(chunked - exact) / exact, 1e-5);
}

TEST(SegmentReduce, EdgeSizes) {
  CardSet cards = CardSet::from_list("0");
  device::Card& card = cards.card(0);
  card.activate();
  const auto& stream = card.stream();
  EXPECT_THROW(SegmentReducer<float>(card, 3), Error);  // 1 or kFieldGroup fields per item
  SegmentReducer<float> reducer(card);
  auto out = card.make_buffer<float>(4);
  const std::vector<position_t> identity = {0, 1, 2, 3};
  auto d_identity = to_device(identity, card.memory(), stream);
  auto d_values = to_device(std::vector<float>{1.5f, -2.0f, 4.0f}, card.memory(), stream);
  const Gathered source{{d_values.data(), d_identity.data(), 1}};
  const Scattered sink{{out.data(), d_identity.data(), 1}};
  // No segments, no fields: nothing is written.
  device::memset_bytes_async(out.data(), 0, out.bytes(), stream);
  auto d_start0 = to_device(std::vector<position_t>{0}, card.memory(), stream);
  reducer.run(d_start0.data(), 0, 0, 1, source, sink, stream);
  auto d_start = to_device(std::vector<position_t>{0, 0, 1, 3}, card.memory(), stream);
  reducer.run(d_start.data(), 3, 3, 0, source, sink, stream);
  EXPECT_EQ(to_host(out), (std::vector<float>{0, 0, 0, 0}));
  // Empty, single and two-value segments.
  device::memset_bytes_async(out.data(), 0xff, out.bytes(), stream);
  reducer.run(d_start.data(), 3, 3, 1, source, sink, stream);
  const auto got = to_host(out);
  EXPECT_EQ(got[0], 0.0f);
  EXPECT_EQ(got[1], 1.5f);
  EXPECT_EQ(got[2], 2.0f);
  EXPECT_TRUE(std::isnan(got[3]));  // segment 3 does not exist
}

// Once the scratch has grown, a call of the same or smaller size allocates no card memory.
TEST(SegmentReduce, SteadyStateAllocatesNothing) {
  const Problem p = make_problem(5, 3, 20000, 500);
  CardSet cards = CardSet::from_list("0");
  device::Card& card = cards.card(0);
  card.activate();
  const auto& stream = card.stream();
  OnCard d(p, card);
  SegmentReducer<float> reducer(card);
  reducer.run(d.start.data(), p.segments(), p.positions(), p.fields, d.source(), d.sink(), stream);
  const std::size_t held = card.memory().bytes_in_use();
  const std::size_t peak = card.memory().peak_bytes();
  EXPECT_GT(reducer.memory_bytes(), 0u);
  for (int i = 0; i < 3; ++i) {
    reducer.run(d.start.data(), p.segments(), p.positions(), p.fields, d.source(), d.sink(),
                stream);
    reducer.run(d.start.data(), p.segments() / 2, p.start[p.segments() / 2], p.fields, d.source(),
                d.sink(), stream);
  }
  stream.synchronize();
  EXPECT_EQ(card.memory().bytes_in_use(), held);
  EXPECT_EQ(card.memory().peak_bytes(), peak);
}

}  // namespace
}  // namespace gpubox::heter_comm::detail
