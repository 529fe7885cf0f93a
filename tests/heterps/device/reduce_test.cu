// reduce_into and reduce_into_then (heterps/device/reduce.cuh): index order kept, deterministic,
// within the documented bound of a long double reference, no host wait or allocation of their own.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "heterps/device/card.hpp"
#include "heterps/device/memory.hpp"
#include "heterps/device/reduce.cuh"

namespace gpubox::device {
namespace {

// ---- reduce_into ----------------------------------------------------------------------------

// 2x2 integer matrices (mod 2^64) under multiplication: associative but not commutative, so a
// fold that changes the order of its operands gives a different product.
struct Mat {
  uint64_t a, b, c, d;
};
struct MatAt {
  const uint64_t* seeds;
  GPUBOX_HD Mat operator()(std::size_t i) const {
    const uint64_t s = seeds[i];
    return Mat{1 + (s & 7), (s >> 3) & 7, (s >> 6) & 7, 1 + ((s >> 9) & 7)};
  }
};
struct MatMul {
  GPUBOX_HD Mat operator()(const Mat& x, const Mat& y) const {
    return Mat{x.a * y.a + x.b * y.c, x.a * y.b + x.b * y.d, x.c * y.a + x.d * y.c,
               x.c * y.b + x.d * y.d};
  }
};
struct FloatAt {
  const float* values;
  GPUBOX_HD double operator()(std::size_t i) const { return values[i]; }
};
struct Plus {
  GPUBOX_HD double operator()(double x, double y) const { return x + y; }
};

class ReduceIntoTest : public ::testing::TestWithParam<std::size_t> {};

// reduce_into keeps index order (a non-commutative product comes out exact), is deterministic
// (the same bits run after run and whatever the thread count), and its float64 sum is within the
// documented bound (reduce.cuh) of a long double reference on either backend; on the cpu backend
// it is also bit-identical to the chunked left-to-right fold (CUDA brackets a chunk as CUB's block
// reduction does).
TEST_P(ReduceIntoTest, FoldsInIndexOrderWithinTheBoundDeterministically) {
  const std::size_t n = GetParam();
  std::mt19937_64 rng(n + 11);
  std::vector<uint64_t> seeds(n);
  for (auto& s : seeds) s = rng();
  std::vector<float> values(n);
  for (auto& v : values) v = std::uniform_real_distribution<float>(-1e3f, 1e3f)(rng);
  // Host reference: the matrix product in index order (exact: order is all that matters).
  Mat want{1, 0, 0, 1};
  for (std::size_t i = 0; i < n; ++i) want = MatMul{}(want, MatAt{seeds.data()}(i));
  // Host reference for floats: the same chunked order as reduce_into, bit for bit.
  std::vector<double> level(values.begin(), values.end());
  while (level.size() > 1) {
    std::vector<double> next;
    for (std::size_t c = 0; c < level.size(); c += kReduceChunk) {
      double acc = level[c];
      for (std::size_t i = c + 1; i < std::min(level.size(), c + kReduceChunk); ++i)
        acc += level[i];
      next.push_back(acc);
    }
    level.swap(next);
  }
  const double chunked_sum = level.empty() ? -1.0 : level[0];
  long double exact = 0;
  double magnitude = 0;
  for (float v : values) {
    exact += v;
    magnitude += std::fabs(static_cast<double>(v));
  }
  std::size_t levels = 0;
  for (std::size_t m = n; m > 1; m = (m + kReduceChunk - 1) / kReduceChunk) ++levels;
  const double bound = static_cast<double>(std::max<std::size_t>(levels, 1) * kReduceChunk) *
                       std::numeric_limits<double>::epsilon() * magnitude;
  std::vector<double> runs;
  for (int threads : {1, 2}) {
    CardSet cards = CardSet::from_list("0", 0, 1, threads);
    Card& card = cards.card(0);
    card.activate();
    auto dev_seeds = to_device(seeds, card.memory(), card.stream());
    auto dev_values = to_device(values, card.memory(), card.stream());
    auto mats = card.make_buffer<Mat>(1 + reduce_partials(n));
    auto sums = card.make_buffer<double>(1 + reduce_partials(n));
    const DeviceCounts before = card.counts();
    reduce_into(card.stream(), n, MatAt{dev_seeds.data()}, MatMul{}, Mat{1, 0, 0, 1},
                mats.data() + 1, mats.data());
    reduce_into(card.stream(), n, FloatAt{dev_values.data()}, Plus{}, -1.0, sums.data() + 1,
                sums.data());
    EXPECT_EQ((card.counts() - before).host_syncs, 0u);
    EXPECT_EQ((card.counts() - before).allocations, 0u);
    const Mat got = to_host(mats.data(), 1, card.stream())[0];
    EXPECT_TRUE(got.a == want.a && got.b == want.b && got.c == want.c && got.d == want.d)
        << "n=" << n << " threads=" << threads;
    const double sum = to_host(sums.data(), 1, card.stream())[0];
    if (n == 0) {
      EXPECT_EQ(sum, -1.0);
    } else {
      EXPECT_LE(std::fabs(static_cast<double>(static_cast<long double>(sum) - exact)), bound)
          << "n=" << n << " threads=" << threads;
    }
#if !defined(GPUBOX_BACKEND_CUDA)
    EXPECT_EQ(sum, chunked_sum) << "n=" << n << " threads=" << threads;
#else
    (void)chunked_sum;
#endif
    // Again on the same card: the same bits.
    reduce_into(card.stream(), n, FloatAt{dev_values.data()}, Plus{}, -1.0, sums.data() + 1,
                sums.data());
    const double again = to_host(sums.data(), 1, card.stream())[0];
    EXPECT_EQ(std::memcmp(&again, &sum, sizeof(double)), 0) << "n=" << n;
    runs.push_back(sum);
  }
  EXPECT_EQ(std::memcmp(&runs[0], &runs[1], sizeof(double)), 0) << "n=" << n << ": thread counts";
}

INSTANTIATE_TEST_SUITE_P(Sizes, ReduceIntoTest,
                         ::testing::Values(0, 1, 255, 256, 257, 65535, 65536, 65537, 300000));

// reduce_into_then hands the same total to its finish, once, from the fold's last level: no
// launch of its own (the one-thread tails it replaced, issue 31 item 4), the same bits as
// reduce_into, and finish(empty) for no values.
struct AddTotal {
  double* accumulator;
  unsigned long long* calls;
  GPUBOX_HD void operator()(double total) const {
    *accumulator += total;
    *calls += 1;
  }
};

TEST_P(ReduceIntoTest, ThenHandsTheSameTotalToItsFinishOnceWithoutALaunchOfItsOwn) {
  const std::size_t n = GetParam();
  std::mt19937_64 rng(n + 5);
  std::vector<float> values(n);
  for (auto& v : values) v = std::uniform_real_distribution<float>(-1e3f, 1e3f)(rng);
  CardSet cards = CardSet::from_list("0", 0, 1, 2);
  Card& card = cards.card(0);
  card.activate();
  auto dev_values = to_device(values, card.memory(), card.stream());
  auto partials = card.make_buffer<double>(std::max<std::size_t>(1, reduce_partials(n)));
  auto total = card.make_buffer<double>(1);
  const double start = 0.25;
  auto accumulator = to_device(std::vector<double>{start}, card.memory(), card.stream());
  auto calls = to_device(std::vector<unsigned long long>{0}, card.memory(), card.stream());
  const DeviceCounts before = card.counts();
  reduce_into(card.stream(), n, FloatAt{dev_values.data()}, Plus{}, -1.0, partials.data(),
              total.data());
  const DeviceCounts stored = card.counts() - before;
  reduce_into_then(card.stream(), n, FloatAt{dev_values.data()}, Plus{}, -1.0, partials.data(),
                   AddTotal{accumulator.data(), calls.data()});
  const DeviceCounts finished = card.counts() - before - stored;
  EXPECT_EQ(finished.launches, stored.launches) << "n=" << n;
  EXPECT_EQ(finished.host_syncs, 0u);
  EXPECT_EQ(finished.allocations, 0u);
  const double want = start + to_host(total.data(), 1, card.stream())[0];
  const double got = to_host(accumulator.data(), 1, card.stream())[0];
  EXPECT_EQ(std::memcmp(&got, &want, sizeof(double)), 0) << "n=" << n;
  EXPECT_EQ(to_host(calls.data(), 1, card.stream())[0], 1u) << "n=" << n;
}

TEST(ReduceInto, PartialsCoverEveryLevel) {
  EXPECT_EQ(reduce_partials(0), 0u);
  EXPECT_EQ(reduce_partials(256), 0u);      // one level writes *out
  EXPECT_EQ(reduce_partials(257), 2u);      // 2 partials, then *out
  EXPECT_EQ(reduce_partials(65536), 256u);  // 256, then *out
  EXPECT_EQ(reduce_partials(65537), 257 + 2u);
}

}  // namespace
}  // namespace gpubox::device
