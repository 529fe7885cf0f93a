// device::PairSorter and device::Scanner (sort_scan.cuh) against std::stable_sort and a
// left-to-right sum, at the tails (0, 1, one run, one past it, many merge levels), with the
// temporary storage sized once, and captured in a StepGraph and replayed (cpu: recorded).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "heterps/device/card.hpp"
#include "heterps/device/memory.hpp"
#include "heterps/device/sort_scan.cuh"
#include "heterps/device/step_graph.hpp"

#if !defined(GPUBOX_BACKEND_CUDA)
#include <omp.h>
#endif

namespace gpubox::device {
namespace {

struct Pair {
  WideKey key;
  uint32_t value;
};

// Keys with many duplicates (so stability shows) and high words below 2^high_bits.
std::vector<WideKey> random_keys(std::size_t n, int high_bits, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<WideKey> keys(n);
  const uint64_t distinct = std::max<std::size_t>(1, n / 3);
  for (auto& k : keys) {
    k.low = (rng() % distinct) * 0x9e3779b97f4a7c15ULL;  // spread over all 64 bits
    k.high = high_bits == 0 ? 0u : rng() % (uint64_t{1} << high_bits);
  }
  return keys;
}

class PairSorterTest : public ::testing::TestWithParam<std::size_t> {};

TEST_P(PairSorterTest, EqualsStdStableSortAndAllocatesNothingOnceReserved) {
  const std::size_t n = GetParam();
  CardSet cards = CardSet::from_list("0");
  Card& card = cards.card(0);
  card.activate();
  for (const int high_bits : {0, 1, 3, 32}) {
    SCOPED_TRACE(high_bits);
    const std::vector<WideKey> keys = random_keys(n, high_bits, 7 + n);
    std::vector<uint32_t> values(n);
    std::iota(values.begin(), values.end(), 0u);
    std::vector<Pair> expected(n);
    for (std::size_t i = 0; i < n; ++i) expected[i] = Pair{keys[i], values[i]};
    std::stable_sort(expected.begin(), expected.end(), [&](const Pair& a, const Pair& b) {
      return wide_key_less(a.key, b.key, high_bits);
    });

    auto keys_in = to_device(keys, card.memory(), card.stream());
    auto values_in = to_device(values, card.memory(), card.stream());
    device_buffer<WideKey> keys_out(n, card.memory(), card.stream());
    device_buffer<uint32_t> values_out(n, card.memory(), card.stream());
    PairSorter<uint32_t> sorter(card.memory(), card.stream());
    sorter.reserve(n);
    const DeviceCounts before = card.counts();
    sorter.run(keys_in.data(), keys_out.data(), values_in.data(), values_out.data(), n, high_bits,
               card.stream());
    const DeviceCounts used = card.counts() - before;
    EXPECT_EQ(used.allocations, 0u);
    EXPECT_EQ(used.launches, n == 0 ? 0u : 1u);
    const auto got_keys = to_host(keys_out);
    const auto got_values = to_host(values_out);
    for (std::size_t i = 0; i < n; ++i) {
      ASSERT_EQ(got_keys[i].low, expected[i].key.low) << i;
      ASSERT_EQ(got_keys[i].high, expected[i].key.high) << i;
      ASSERT_EQ(got_values[i], expected[i].value) << "not stable at " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, PairSorterTest,
                         ::testing::Values(0, 1, 2, 16, 17, 1000, 5000, 70000));

// The oracle: std::stable_sort by (high's high_bits low bits, low).
std::vector<Pair> stable_sorted(const std::vector<WideKey>& keys, int high_bits) {
  std::vector<Pair> expected(keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) {
    expected[i] = Pair{keys[i], static_cast<uint32_t>(i)};
  }
  std::stable_sort(expected.begin(), expected.end(), [&](const Pair& a, const Pair& b) {
    const uint64_t mask = high_bits == 0 ? 0 : (uint64_t{1} << high_bits) - 1;
    const uint64_t ha = a.key.high & mask;
    const uint64_t hb = b.key.high & mask;
    return ha != hb ? ha < hb : a.key.low < b.key.low;
  });
  return expected;
}

// Sorts keys on the card with `sorter` (reserved by the caller); expects the oracle's order,
// the keys copied whole (high's ignored bits too), and `allocations` card allocations.
void expect_sorted(PairSorter<uint32_t>& sorter, Card& card, const std::vector<WideKey>& keys,
                   int high_bits, uint64_t allocations) {
  const std::size_t n = keys.size();
  std::vector<uint32_t> values(n);
  std::iota(values.begin(), values.end(), 0u);
  auto keys_in = to_device(keys, card.memory(), card.stream());
  auto values_in = to_device(values, card.memory(), card.stream());
  device_buffer<WideKey> keys_out(n, card.memory(), card.stream());
  device_buffer<uint32_t> values_out(n, card.memory(), card.stream());
  const DeviceCounts before = card.counts();
  sorter.run(keys_in.data(), keys_out.data(), values_in.data(), values_out.data(), n, high_bits,
             card.stream());
  EXPECT_EQ((card.counts() - before).allocations, allocations);
  const std::vector<Pair> expected = stable_sorted(keys, high_bits);
  const auto got_keys = to_host(keys_out);
  const auto got_values = to_host(values_out);
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_EQ(got_values[i], expected[i].value) << "order or stability at " << i;
    ASSERT_EQ(got_keys[i].low, expected[i].key.low) << i;
    ASSERT_EQ(got_keys[i].high, expected[i].key.high) << i;
  }
}

// Reserved once at the largest size, smaller batches and every high_bits reuse the storage.
TEST(PairSorter, ReservedOnceSmallerBatchesAndOtherHighBitsAllocateNothing) {
  CardSet cards = CardSet::from_list("0");
  Card& card = cards.card(0);
  card.activate();
  PairSorter<uint32_t> sorter(card.memory(), card.stream());
  sorter.reserve(5000);
  for (const auto& [n, high_bits] : std::vector<std::pair<std::size_t, int>>{
           {5000, 32}, {1000, 0}, {4999, 6}, {17, 1}, {3000, 32}, {5000, 0}}) {
    SCOPED_TRACE(::testing::Message() << n << " pairs, " << high_bits << " high bits");
    expect_sorted(sorter, card, random_keys(n, high_bits, n + high_bits), high_bits, 0);
  }
}

// Keys whose bits differ only in part (a step's: small feasigns under a 2-bit owner), in all of
// them, or in none: the stable order either way (the cpu twin's serial sort packs the differing
// bits of both words into one when they fit, sorts the keys' own digits when not, and places
// only where a pass's digits differ).
TEST(PairSorter, SkipsThePassesEveryKeySharesInTheStableOrder) {
  CardSet cards = CardSet::from_list("0");
  Card& card = cards.card(0);
  card.activate();
  PairSorter<uint32_t> sorter(card.memory(), card.stream());
  sorter.reserve(5000);
  std::mt19937_64 rng(5);
  for (const std::size_t n : {std::size_t{1}, std::size_t{2}, std::size_t{17}, std::size_t{5000}}) {
    // 62 bits under a varying 2-bit high word, and 64 under a fixed one: one packed word of 64.
    for (const int low_bits : {0, 5, 11, 12, 13, 22, 25, 62, 64}) {
      for (const bool high_varies : {false, true}) {
        // Bits above high_bits in the high word (random, or all set) are ignored by the order
        // and the packing, and copied with the key.
        for (const int above : {0, 1, 2}) {
          SCOPED_TRACE(::testing::Message() << n << " pairs, low bits " << low_bits
                                            << (high_varies ? ", high varies" : "")
                                            << ", bits above high_bits " << above);
          std::vector<WideKey> keys(n);
          for (WideKey& k : keys) {
            k.low = low_bits == 64 ? rng() : rng() % (uint64_t{1} << low_bits);
            k.high = high_varies ? rng() % 3 : 2;
            if (above == 1) k.high |= rng() << 2;
            if (above == 2) k.high |= ~uint64_t{3};
          }
          expect_sorted(sorter, card, keys, 2, 0);
        }
      }
    }
  }
}

// 64-bit feasigns (a step's keys on a real job: every bit differs) under 0 to 2 owner bits: the
// cpu twin splits them by their top bits and sorts each part alone (by insertion when small,
// else by its own differing bits). The stable order at the insertion limit's edges, with a hot
// key holding up to and past half the pairs (past it the split is declined), and with a top
// shared by most keys (a few large parts).
TEST(PairSorter, SplitsFullWidthKeysByTheirTopBitsInTheStableOrder) {
  CardSet cards = CardSet::from_list("0");
  Card& card = cards.card(0);
  card.activate();
  PairSorter<uint32_t> sorter(card.memory(), card.stream());
  sorter.reserve(13824);
  std::mt19937_64 rng(11);
  for (const std::size_t n :
       {std::size_t{47}, std::size_t{48}, std::size_t{49}, std::size_t{50}, std::size_t{13824}}) {
    for (const int high_bits : {0, 1, 2}) {
      for (const std::size_t hot : {std::size_t{0}, n / 2, n / 2 + 1}) {
        for (const bool shared_top : {false, true}) {
          SCOPED_TRACE(::testing::Message() << n << " pairs, high bits " << high_bits << ", hot "
                                            << hot << (shared_top ? ", top shared" : ""));
          std::vector<WideKey> keys(n);
          const WideKey hot_key{rng(), high_bits == 0 ? 0 : rng() % (uint64_t{1} << high_bits)};
          for (WideKey& k : keys) {
            // Shared: 8 tops of 4096 keys each (a few large parts). Duplicates: stability shows.
            k.low = shared_top ? (rng() % 8) << 60 | (rng() % 4096) << 28
                               : rng() % 3000 * 0x9e3779b97f4a7c15ULL;
            k.high = high_bits == 0 ? rng() : rng() % (uint64_t{1} << high_bits) | rng() << 8;
          }
          std::vector<std::size_t> where(n);
          std::iota(where.begin(), where.end(), std::size_t{0});
          std::shuffle(where.begin(), where.end(), rng);
          for (std::size_t i = 0; i < hot; ++i) keys[where[i]] = hot_key;
          expect_sorted(sorter, card, keys, high_bits, 0);
        }
      }
    }
  }
}

#if !defined(GPUBOX_BACKEND_CUDA)
// The cpu twin on a card of 3 threads (parts of unequal sizes) and of 1: below, at and above
// kParallelSortLimit, where it sorts on the card's threads, the same stable order as
// std::stable_sort; reserved on 3 threads, a run on 1 (the same storage) sorts alike.
TEST(PairSorter, OnTheCardsThreadsEqualsStdStableSort) {
  constexpr std::size_t kLimit = kParallelSortLimit;
  for (const int threads : {3, 1}) {
    CardSet cards = CardSet::from_list("0", 0, 1, threads);
    Card& card = cards.card(0);
    card.activate();
    PairSorter<uint32_t> sorter(card.memory(), card.stream());
    sorter.reserve(3 * kLimit);
    for (const auto& [n, high_bits] :
         std::vector<std::pair<std::size_t, int>>{{0, 0},
                                                  {1, 32},
                                                  {kLimit - 1, 3},
                                                  {kLimit, 0},
                                                  {kLimit + 1, 32},
                                                  {3 * kLimit, 1},
                                                  {2 * kLimit + 7, 6}}) {
      SCOPED_TRACE(::testing::Message()
                   << threads << " threads, " << n << " pairs, " << high_bits << " high bits");
      expect_sorted(sorter, card, random_keys(n, high_bits, 31 * n + high_bits), high_bits, 0);
    }
    // Every key alike in some digits (skipped passes) and in all of them.
    std::vector<WideKey> alike(kLimit + 3, WideKey{0x0123456789abcdefULL, 5});
    expect_sorted(sorter, card, alike, 32, 0);
    for (std::size_t i = 0; i < alike.size(); i += 2) alike[i].low ^= i << 20;
    expect_sorted(sorter, card, alike, 32, 0);
    card.activate();
    omp_set_num_threads(1);  // the card's threads as a run sees them
    expect_sorted(sorter, card, random_keys(2 * kLimit, 32, 99), 32, 0);
  }
}
#endif

// The extreme words: low 0 and ~0, high 0 and 2^high_bits - 1.
TEST(PairSorter, SortsTheExtremeWords) {
  CardSet cards = CardSet::from_list("0");
  Card& card = cards.card(0);
  card.activate();
  PairSorter<uint32_t> sorter(card.memory(), card.stream());
  for (const int high_bits : {0, 1, 6, 32}) {
    SCOPED_TRACE(high_bits);
    const uint64_t top = high_bits == 0 ? 0 : (uint64_t{1} << high_bits) - 1;
    std::vector<WideKey> keys;
    for (int i = 0; i < 40; ++i) {
      for (const uint64_t low : {~uint64_t{0}, uint64_t{0}, uint64_t{1}, ~uint64_t{0} - 1}) {
        keys.push_back(WideKey{low, i % 3 == 0 ? top : 0});
      }
    }
    sorter.reserve(keys.size());
    expect_sorted(sorter, card, keys, high_bits, 0);
  }
}

// The contract for high words past high_bits: their upper bits are ignored by the order (keys
// equal but for them keep their input order) and copied through, as CUB's end_bit does.
TEST(PairSorter, IgnoresHighBitsPastHighBitsAndCopiesThemThrough) {
  CardSet cards = CardSet::from_list("0");
  Card& card = cards.card(0);
  card.activate();
  PairSorter<uint32_t> sorter(card.memory(), card.stream());
  sorter.reserve(64);
  // high = (upper garbage << 2) | owner: with 2 high bits only the owner orders.
  std::vector<WideKey> keys;
  for (uint64_t i = 0; i < 64; ++i) {
    keys.push_back(WideKey{(i * 7) % 5, ((63 - i) << 2) | (i % 4)});
  }
  expect_sorted(sorter, card, keys, 2, 0);
  // With 0 high bits the whole high word is ignored: the order is by low alone.
  expect_sorted(sorter, card, keys, 0, 0);
}

struct Odd {
  const uint32_t* values;
  GPUBOX_HD uint32_t operator()(std::size_t i) const { return values[i] & 1u; }
};

TEST(Scanner, InclusiveSumOfAFunctorEqualsPartialSum) {
  CardSet cards = CardSet::from_list("0");
  Card& card = cards.card(0);
  card.activate();
  for (const std::size_t n :
       {std::size_t{0}, std::size_t{1}, std::size_t{3000}, std::size_t{100001}}) {
    std::vector<uint32_t> values(n);
    std::mt19937 rng(static_cast<uint32_t>(n));
    for (auto& v : values) v = rng();
    std::vector<uint32_t> expected(n);
    uint32_t sum = 0;
    for (std::size_t i = 0; i < n; ++i) expected[i] = sum += values[i] & 1u;
    auto in = to_device(values, card.memory(), card.stream());
    device_buffer<uint32_t> out(n, card.memory(), card.stream());
    Scanner<uint32_t> scanner(card.memory(), card.stream());
    scanner.reserve(n);
    const DeviceCounts before = card.counts();
    scanner.inclusive(Odd{in.data()}, out.data(), n, card.stream());
    EXPECT_EQ((card.counts() - before).allocations, 0u) << n;
    EXPECT_EQ(to_host(out), expected) << n;
  }
}

// Reserved, a sort and a scan are capturable (no allocation, no wait, no Thrust call): replayed
// over new inputs in the same buffers they give the eager results.
TEST(SortScan, CapturedInAStepGraphReplaysOverNewInputs) {
  CardSet cards = CardSet::from_list("0");
  Card& card = cards.card(0);
  card.activate();
  const std::size_t n = 3000;
  device_buffer<WideKey> keys_in(n, card.memory(), card.stream());
  device_buffer<uint32_t> values_in(n, card.memory(), card.stream());
  device_buffer<WideKey> keys_out(n, card.memory(), card.stream());
  device_buffer<uint32_t> values_out(n, card.memory(), card.stream());
  device_buffer<uint32_t> scanned(n, card.memory(), card.stream());
  PairSorter<uint32_t> sorter(card.memory(), card.stream());
  Scanner<uint32_t> scanner(card.memory(), card.stream());
  sorter.reserve(n);
  scanner.reserve(n);
  auto work = [&] {
    sorter.run(keys_in.data(), keys_out.data(), values_in.data(), values_out.data(), n, 2,
               card.stream());
    scanner.inclusive(Odd{values_out.data()}, scanned.data(), n, card.stream());
  };
  StepGraph graph("sort and scan");
  graph.capture(card.stream(), work);
  EXPECT_EQ(graph.contents().launches, 2u);
  for (uint64_t seed : {1u, 2u}) {
    std::vector<uint32_t> values(n);
    std::iota(values.begin(), values.end(), static_cast<uint32_t>(seed));
    const auto keys = random_keys(n, 2, seed);
    copy_async(keys_in.data(), keys.data(), n, card.stream());
    copy_async(values_in.data(), values.data(), n, card.stream());
    graph.replay(card.stream());
    const auto replayed_keys = to_host(keys_out);
    const auto replayed_scan = to_host(scanned);
    work();  // eagerly, the same inputs
    const auto eager_keys = to_host(keys_out);
    EXPECT_EQ(replayed_scan, to_host(scanned));
    for (std::size_t i = 0; i < n; ++i) {
      ASSERT_EQ(replayed_keys[i].low, eager_keys[i].low);
      ASSERT_EQ(replayed_keys[i].high, eager_keys[i].high);
    }
  }
}

}  // namespace
}  // namespace gpubox::device
