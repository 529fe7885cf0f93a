// Backend layer: buffers, copies, parallel_for and the Thrust path, cards.
#include <gtest/gtest.h>
#include <omp.h>
#include <thrust/reduce.h>
#include <thrust/sort.h>

#include <algorithm>
#include <atomic>
#include <numeric>
#include <random>
#include <thread>

#include "heterps/device/card.hpp"
#include "heterps/device/exec_policy.cuh"
#include "heterps/device/memory.hpp"
#include "heterps/device/parallel_for.cuh"

namespace gpubox::device {
namespace {

struct SquarePlusOne {
  const int64_t* in;
  int64_t* out;
  GPUBOX_HD void operator()(std::size_t i) const { out[i] = in[i] * in[i] + 1; }
};

class DeviceTest : public ::testing::TestWithParam<std::size_t> {};

TEST_P(DeviceTest, ParallelForMatchesSerialReference) {
  CardSet cards = CardSet::from_list("0");
  Card& card = cards.card(0);
  card.activate();
  const std::size_t n = GetParam();
  std::vector<int64_t> host(n);
  std::mt19937_64 rng(n);
  for (auto& v : host) v = static_cast<int64_t>(rng() % 100000) - 50000;
  auto in = to_device(host, card.memory(), card.stream());
  auto out = card.make_buffer<int64_t>(n);
  parallel_for(card.stream(), n, SquarePlusOne{in.data(), out.data()});
  std::vector<int64_t> got = to_host(out);
  ASSERT_EQ(got.size(), n);
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(got[i], host[i] * host[i] + 1) << i;
}

TEST_P(DeviceTest, ThrustSortAndReduceOnCardStream) {
  CardSet cards = CardSet::from_list("0");
  Card& card = cards.card(0);
  card.activate();
  const std::size_t n = GetParam();
  std::vector<uint64_t> host(n);
  std::mt19937_64 rng(n + 7);
  for (auto& v : host) v = rng();
  auto keys = to_device(host, card.memory(), card.stream());
  thrust::sort(exec_policy(card.stream()), keys.begin(), keys.end());
  uint64_t sum = thrust::reduce(exec_policy(card.stream()), keys.begin(), keys.end(), uint64_t{0});
  std::sort(host.begin(), host.end());
  EXPECT_EQ(to_host(keys), host);
  EXPECT_EQ(sum, std::accumulate(host.begin(), host.end(), uint64_t{0}));
}

INSTANTIATE_TEST_SUITE_P(Sizes, DeviceTest, ::testing::Values(0, 1, 7, 2047, 2048, 2049, 1 << 20));

TEST(DeviceBuffer, ResizeKeepsPrefixAndCountsMemory) {
  CardSet cards = CardSet::from_list("3");
  Card& card = cards.card(0);
  EXPECT_EQ(card.device(), 3);
  EXPECT_EQ(card.memory().bytes_in_use(), 0u);
  {
    auto buf = to_device(std::vector<int>{0, 1, 2, 3}, card.memory(), card.stream());
    buf.resize(100);
    EXPECT_EQ(buf.size(), 100u);
    std::vector<int> prefix = to_host(buf.data(), 4, buf.stream());
    EXPECT_EQ(prefix, (std::vector<int>{0, 1, 2, 3}));
    EXPECT_GE(card.memory().bytes_in_use(), 100 * sizeof(int));
    const std::size_t cap = buf.capacity();
    buf.resize_discard(10);  // shrinking keeps capacity: no allocation when reused
    EXPECT_EQ(buf.capacity(), cap);
    device_buffer<int> moved = std::move(buf);
    EXPECT_EQ(buf.data(), nullptr);
    EXPECT_EQ(moved.size(), 10u);
  }
  EXPECT_EQ(card.memory().bytes_in_use(), 0u);  // RAII: all freed
  EXPECT_GE(card.memory().peak_bytes(), 100 * sizeof(int));
}

TEST(DeviceBuffer, CopiesBetweenCardsAndPinnedHost) {
  CardSet cards = CardSet::from_list("0,1");
  Card& a = cards.card(0);
  Card& b = cards.card(1);
  std::vector<float> host(1000);
  std::iota(host.begin(), host.end(), 0.5f);
  auto on_a = to_device(host, a.memory(), a.stream());
  auto on_b = b.make_buffer<float>(host.size());
  copy_async(on_b.data(), on_a.data(), host.size(), b.stream());
  pinned_buffer<float> staging(host.size());
  copy_async(staging.data(), on_b.data(), host.size(), b.stream());
  b.stream().synchronize();
  for (std::size_t i = 0; i < host.size(); ++i) EXPECT_EQ(staging[i], host[i]);
  memset_bytes_async(on_b.data(), 0, on_b.bytes(), b.stream());
  for (float v : to_host(on_b)) EXPECT_EQ(v, 0.0f);
  Event done(b.device());
  done.record(b.stream());
  a.stream().wait(done);
  done.synchronize();
}

TEST(CardSet, ParsesListsAndRejectsBadOnes) {
  CardSet four = CardSet::from_list("0,1,2,3");
  EXPECT_EQ(four.num_local_cards(), 4);
  EXPECT_EQ(four.total_cards(), 4);
  // No oversubscription: the cards' threads together never exceed the machine's.
  EXPECT_LE(four.card(0).threads() * 4, std::max(4, hardware_threads()));
  CardSet second = CardSet::from_list("0, 1", /*trainer_id=*/1, /*trainer_count=*/2);
  EXPECT_EQ(second.total_cards(), 4);
  EXPECT_EQ(second.card(1).rank(), 3);
  EXPECT_THROW(CardSet::from_list(""), Error);
  EXPECT_THROW(CardSet::from_list("0,,1"), Error);
  EXPECT_THROW(CardSet::from_list("0,x"), Error);
  EXPECT_THROW(CardSet::from_list("1,1"), Error);
  EXPECT_THROW(CardSet::from_list("0", 2, 2), Error);
}

TEST(CardSet, RunOnCardsUsesOneThreadPerCardAndReportsFailures) {
  CardSet cards = CardSet::from_list("0,1,2");
  std::atomic<int> ran{0};
  cards.run_on_cards([&](Card& card) {
    EXPECT_EQ(omp_get_max_threads(), card.threads());
    ran++;
  });
  EXPECT_EQ(ran.load(), 3);
  std::atomic<int> failures{0};
  try {
    cards.run_on_cards(
        [&](Card& card) {
          if (card.local_index() == 1) GPUBOX_FAIL("boom on purpose");
        },
        [&](const std::string& why) {
          EXPECT_NE(why.find("boom on purpose"), std::string::npos);
          failures++;
        });
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("card 1"), std::string::npos) << e.what();
  }
  EXPECT_EQ(failures.load(), 1);
}

}  // namespace
}  // namespace gpubox::device
