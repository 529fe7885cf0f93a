// Backend layer: buffers, copies, parallel_for and the Thrust path, cards; the per-card counters.
// The memory registry, GPUBOX_DEVICE_CHECK and the scratch arena: memory_test.cu; reduce_into:
// reduce_test.cu (the same binary, device_test).
#include <gtest/gtest.h>
#include <omp.h>
#include <thrust/reduce.h>
#include <thrust/sort.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <new>
#include <numeric>
#include <random>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "common/error.hpp"
#include "common/thread_annotations.hpp"
#include "heterps/device/card.hpp"
#include "heterps/device/exec_policy.cuh"
#include "heterps/device/isa_clones.cuh"
#include "heterps/device/memory.hpp"
#include "heterps/device/memory_registry.hpp"
#include "heterps/device/parallel_for.cuh"
#include "tests/heterps/device/test_cards.hpp"

namespace gpubox::device {
namespace {

struct SquarePlusOne {
  const int64_t* in;
  int64_t* out;
  GPUBOX_HD void operator()(std::size_t i) const { out[i] = in[i] * in[i] + 1; }
};

class DeviceTest : public ::testing::TestWithParam<std::size_t> {};

// n values in [-50000, 50000), seeded.
std::vector<int64_t> signed_values(std::size_t n, uint64_t seed) {
  std::vector<int64_t> host(n);
  std::mt19937_64 rng(seed);
  for (auto& v : host) v = static_cast<int64_t>(rng() % 100000) - 50000;
  return host;
}

TEST_P(DeviceTest, ParallelForMatchesSerialReference) {
  CardSet cards = CardSet::from_list("0");
  Card& card = cards.card(0);
  card.activate();
  const std::size_t n = GetParam();
  const std::vector<int64_t> host = signed_values(n, n);
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

#if !defined(GPUBOX_BACKEND_CUDA)
// A functor with the cpu's run_range hook: the items of one call are counted, and the per-item
// form marks what it wrote, so the test sees which form ran.
struct SquarePlusOneInRanges {
  const int64_t* in;
  int64_t* out;
  std::atomic<int>* ranges;
  GPUBOX_HD void operator()(std::size_t i) const { out[i] = -1; }
  void run_range(std::size_t begin, std::size_t end) const {
    ranges->fetch_add(1);
    for (std::size_t i = begin; i < end; ++i) out[i] += in[i] * in[i] + 1;
  }
};

// Every item exactly once (out starts at 0 and is added to), through run_range only, in at most
// one call per thread; the serial path (n < kSerialLoopLimit, or one thread) in one call.
TEST_P(DeviceTest, ParallelForHandsEachThreadOneRangeWhenTheFunctorTakesRanges) {
  CardSet cards = CardSet::from_list("0");
  Card& card = cards.card(0);
  card.activate();
  const std::size_t n = GetParam();
  const std::vector<int64_t> host = signed_values(n, n + 1);
  auto in = to_device(host, card.memory(), card.stream());
  const int threads_before = omp_get_max_threads();
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    auto out = to_device(std::vector<int64_t>(n, 0), card.memory(), card.stream());
    std::atomic<int> ranges{0};
    parallel_for(card.stream(), n, SquarePlusOneInRanges{in.data(), out.data(), &ranges});
    const std::vector<int64_t> got = to_host(out);
    for (std::size_t i = 0; i < n; ++i) {
      ASSERT_EQ(got[i], host[i] * host[i] + 1) << i << " of " << n << ", " << threads << " threads";
    }
    const bool serial = n < kSerialLoopLimit || threads == 1;
    EXPECT_LE(ranges.load(), n == 0 ? 0 : (serial ? 1 : threads)) << n << ", " << threads;
    EXPECT_GE(ranges.load(), n == 0 ? 0 : 1);
  }
  omp_set_num_threads(threads_before);
}

// A caller's serial limit: items whose each is worth many values (a row kernel's rows) split over
// the threads below kSerialLoopLimit items, and the default keeps such a loop in one call.
TEST(ParallelFor, SplitsFromTheCallersSerialLimit) {
  CardSet cards = CardSet::from_list("0");
  Card& card = cards.card(0);
  card.activate();
  const std::size_t n = 64;
  const std::vector<int64_t> host = signed_values(n, 3);
  auto in = to_device(host, card.memory(), card.stream());
  const int threads_before = omp_get_max_threads();
  for (int threads : {2, 3}) {
    omp_set_num_threads(threads);
    for (const std::size_t limit : {kSerialLoopLimit, n, n + 1}) {
      auto out = to_device(std::vector<int64_t>(n, 0), card.memory(), card.stream());
      std::atomic<int> ranges{0};
      parallel_for(card.stream(), n, SquarePlusOneInRanges{in.data(), out.data(), &ranges}, limit);
      const std::vector<int64_t> got = to_host(out);
      for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(got[i], host[i] * host[i] + 1) << i;
      // Every thread has items (n >= threads) when the loop splits.
      EXPECT_EQ(ranges.load(), n < limit ? 1 : threads) << threads << " threads, limit " << limit;
    }
  }
  omp_set_num_threads(threads_before);
}

// a x + b, elementwise; this file builds with -ffp-contract=off (tests/heterps/CMakeLists.txt), as
// isa_clones.cuh asks of its callers.
struct MultiplyAdd {
  const float* x;
  float* y;
  GPUBOX_HD void operator()(std::size_t i) const { y[i] = x[i] * 1.1f + 0.3f; }
};

// isa_clones: every item exactly once through either form (run_range, or one call per item),
// on 1 to 3 threads, and a float loop's bits the baseline's (the clones contract nothing).
TEST_P(DeviceTest, IsaClonesRunEveryItemOnceWithTheBaselinesBits) {
  CardSet cards = CardSet::from_list("0");
  Card& card = cards.card(0);
  card.activate();
  const std::size_t n = GetParam();
  const std::vector<int64_t> host = signed_values(n, n + 2);
  auto in = to_device(host, card.memory(), card.stream());
  std::vector<float> xs(n), want(n);
  for (std::size_t i = 0; i < n; ++i) {
    xs[i] = static_cast<float>(host[i]) / 7.0f;
    want[i] = xs[i] * 1.1f + 0.3f;
  }
  auto x = to_device(xs, card.memory(), card.stream());
  const int threads_before = omp_get_max_threads();
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    auto per_item = card.make_buffer<int64_t>(n);
    parallel_for(card.stream(), n, isa_clones(SquarePlusOne{in.data(), per_item.data()}));
    auto ranged = to_device(std::vector<int64_t>(n, 0), card.memory(), card.stream());
    std::atomic<int> ranges{0};
    parallel_for(card.stream(), n,
                 isa_clones(SquarePlusOneInRanges{in.data(), ranged.data(), &ranges}));
    auto y = card.make_buffer<float>(n);
    parallel_for(card.stream(), n, isa_clones(MultiplyAdd{x.data(), y.data()}));
    const std::vector<int64_t> got_items = to_host(per_item), got_ranges = to_host(ranged);
    const std::vector<float> got_y = to_host(y);
    for (std::size_t i = 0; i < n; ++i) {
      const int64_t expected = host[i] * host[i] + 1;
      ASSERT_EQ(got_items[i], expected) << i << " of " << n << ", " << threads << " threads";
      ASSERT_EQ(got_ranges[i], expected) << i << " of " << n << ", " << threads << " threads";
      ASSERT_EQ(std::memcmp(&got_y[i], &want[i], sizeof(float)), 0) << i << ": " << got_y[i];
    }
  }
  omp_set_num_threads(threads_before);
}
#endif

INSTANTIATE_TEST_SUITE_P(Sizes, DeviceTest, ::testing::Values(0, 1, 7, 2047, 2048, 2049, 1 << 20));

TEST(DeviceBuffer, ResizeKeepsPrefixAndCountsMemory) {
  GPUBOX_REQUIRE_CARDS(4);
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
  GPUBOX_REQUIRE_CARDS(2);
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
  GPUBOX_REQUIRE_CARDS(4);
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
  GPUBOX_REQUIRE_CARDS(3);
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

// on_failure runs in the failed card's thread, and its copies of the message can fail to
// allocate (most likely when the card itself ran out of memory): it is told again with a literal
// that needs no allocation, so the peers still wake and the failure is thrown from run_on_cards;
// before, the bad_alloc escaped the card's thread (std::terminate).
TEST(CardSet, RunOnCardsTellsAFailureWhoseMessageCannotBeCopied) {
  GPUBOX_REQUIRE_CARDS(3);
  CardSet cards = CardSet::from_list("0,1,2");
  std::vector<std::string> told;
  Mutex mu;
  try {
    cards.run_on_cards(
        [&](Card& card) {
          if (card.local_index() == 1) GPUBOX_FAIL("boom on purpose");
        },
        [&](const std::string& why) {
          MutexLock lock(mu);
          told.push_back(why);
          if (told.size() == 1) throw std::bad_alloc();
        });
    FAIL() << "no throw";
  } catch (const CardsFailed& e) {
    EXPECT_EQ(e.message(), "card 1: boom on purpose");
  }
  ASSERT_EQ(told.size(), 2u);
  EXPECT_EQ(told[0], "card 1: boom on purpose");
  EXPECT_EQ(told[1], "out of memory");
}

// A card whose thread cannot start (std::system_error) is that card's failure: the cards
// started, waiting for it in a collective, are woken by on_failure and joined, and the error is
// thrown from run_on_cards; before, the vector of joinable threads was destroyed
// (std::terminate), or the started cards waited for the one that never ran.
TEST(CardSet, RunOnCardsFailsACardWhoseThreadCannotStart) {
  GPUBOX_REQUIRE_CARDS(3);
  CardSet cards = CardSet::from_list("0,1,2");
  cards.set_thread_start_fault([](int local_index) {
    if (local_index == 2) throw std::system_error(EAGAIN, std::generic_category(), "no thread");
  });
  Mutex mu;
  CondVar woken;
  std::string told;
  std::atomic<int> ran{0};
  try {
    cards.run_on_cards(
        [&](Card&) {
          ran++;
          MutexLock lock(mu);  // a collective waiting for every card
          while (told.empty()) woken.wait(lock);
          throw FailureTold("stopped: " + told);
        },
        [&](const std::string& why) {
          MutexLock lock(mu);
          if (told.empty()) told = why;
          woken.notify_all();
        });
    FAIL() << "no throw";
  } catch (const CardsFailed& e) {
    EXPECT_EQ(e.message().rfind("card 2: no thread", 0), 0u) << e.message();
    ASSERT_EQ(e.failures().size(), 3u);
    EXPECT_FALSE(e.failures()[2].told);
    EXPECT_TRUE(e.failures()[0].told);
  }
  EXPECT_EQ(ran.load(), 2);
  EXPECT_EQ(told.rfind("card 2: no thread", 0), 0u) << told;
}

// Every card that failed is listed (in card order, with its own message), not only the one
// whose error is thrown: a caller naming more than one cause sees them all.
TEST(CardSet, RunOnCardsListsEveryFailedCard) {
  GPUBOX_REQUIRE_CARDS(3);
  CardSet cards = CardSet::from_list("0,1,2");
  try {
    cards.run_on_cards([&](Card& card) {
      if (card.local_index() != 1) GPUBOX_FAIL("fault ", card.local_index());
    });
    FAIL() << "no throw";
  } catch (const CardsFailed& e) {
    ASSERT_EQ(e.failures().size(), 2u);
    EXPECT_EQ(e.failures()[0].rank, 0);
    EXPECT_EQ(e.failures()[0].message, "fault 0");
    EXPECT_EQ(e.failures()[1].rank, 2);
    EXPECT_EQ(e.failures()[1].message, "fault 2");
    // The message is the first failed card's, as before.
    EXPECT_TRUE(e.message() == "card 0: fault 0" || e.message() == "card 2: fault 2")
        << e.message();
  }
}

// A card whose error only tells of another failure (a FailureTold: stopped by another thread's,
// another trainer's heard) is marked so, its message made after the join as any other's.
TEST(CardSet, RunOnCardsMarksAFailureTold) {
  GPUBOX_REQUIRE_CARDS(2);
  CardSet cards = CardSet::from_list("0,1");
  try {
    cards.run_on_cards([&](Card& card) {
      if (card.local_index() == 0) GPUBOX_FAIL("fault 0");
      throw FailureTold("stopped: card 0: fault 0");
    });
    FAIL() << "no throw";
  } catch (const CardsFailed& e) {
    ASSERT_EQ(e.failures().size(), 2u);
    EXPECT_FALSE(e.failures()[0].told);
    EXPECT_TRUE(e.failures()[1].told);
    EXPECT_EQ(e.failures()[1].message, "stopped: card 0: fault 0");
  }
}

TEST(CardSet, PeerAccessCoversEveryPairOfCards) {
  GPUBOX_REQUIRE_CARDS(2);
  CardSet cards = CardSet::from_list("0,1");
  EXPECT_TRUE(cards.peer_access(0, 0));
#if !defined(GPUBOX_BACKEND_CUDA)
  EXPECT_TRUE(cards.peer_access(0, 1));  // simulated cards share the host's memory
  EXPECT_TRUE(cards.peer_access(1, 0));
#endif
  EXPECT_THROW(cards.peer_access(0, 2), Error);
}

// ---- counters: what host code asks of a card ----------------------------------------------

struct AddOne {
  int* values;
  GPUBOX_HD void operator()(std::size_t i) const { values[i] += 1; }
};

TEST(DeviceCounters, CountWaitsAllocationsCopiesAndLaunchesOnTheStreamsCard) {
  GPUBOX_REQUIRE_CARDS(2);
  CardSet cards = CardSet::from_list("0,1");
  Card& card = cards.card(0);
  Card& other = cards.card(1);
  card.activate();
  const DeviceCounts start = card.counts();
  const DeviceCounts other_start = other.counts();
  std::vector<int> host(1000, 7);
  // to_device: one allocation, one pageable copy, one wait.
  auto buffer = to_device(host, card.memory(), card.stream());
  DeviceCounts d = card.counts() - start;
  EXPECT_EQ(d.allocations, 1u);
  EXPECT_EQ(d.pageable_copies, 1u);
  EXPECT_EQ(d.pinned_copies, 0u);
  EXPECT_EQ(d.host_syncs, 1u);
  // A pinned round trip: two pinned copies, no new allocation on the card.
  pinned_buffer<int> staging(host.size());
  copy_async(staging.data(), buffer.data(), host.size(), card.stream());
  copy_async(buffer.data(), staging.data(), host.size(), card.stream());
  d = card.counts() - start;
  EXPECT_EQ(d.pinned_copies, 2u);
  EXPECT_EQ(d.allocations, 1u);
  // Launches: parallel_for (not for n = 0), a memset, a Thrust call through exec_policy.
  parallel_for(card.stream(), host.size(), AddOne{buffer.data()});
  parallel_for(card.stream(), 0, AddOne{buffer.data()});
  memset_bytes_async(buffer.data(), 0, buffer.bytes(), card.stream());
  const int sum = host_result(card.stream(), [&] {
    return thrust::reduce(exec_policy(card.stream()), buffer.begin(), buffer.end(), 0);
  });
  EXPECT_EQ(sum, 0);
  d = card.counts() - start;
  EXPECT_EQ(d.launches, 3u);
  EXPECT_EQ(d.host_syncs, 2u);  // to_device's and the reduce's readback
  // A card-to-card copy counts on the card whose stream carries it; a wait on the stream too.
  auto on_other = other.make_buffer<int>(host.size());
  copy_async(on_other.data(), buffer.data(), host.size(), other.stream());
  other.stream().synchronize();
  EXPECT_EQ((other.counts() - other_start).card_copies, 1u);
  EXPECT_EQ((other.counts() - other_start).host_syncs, 1u);
  EXPECT_EQ((card.counts() - start).card_copies, 0u);
  Event done(card.device(), card.stream().counters());
  done.record(card.stream());
  done.synchronize();
  EXPECT_EQ((card.counts() - start).host_syncs, 3u);  // to_device, the reduce, the event
}

// The card's copy stream (issue 31, item 4: the next batch's upload beside the step): its copies
// count as copy_stream_copies besides their kind (the compute stream's do not), and a stream's
// wait for another stream's event is a stream wait, not a host wait. The copy lands.
TEST(DeviceCounters, CopyStreamCopiesAndStreamWaitsAreCountedApartFromHostWaits) {
  CardSet cards = CardSet::from_list("0");
  Card& card = cards.card(0);
  card.activate();
  EXPECT_EQ(card.stream().role(), StreamRole::kCompute);
  EXPECT_EQ(card.copy_stream().role(), StreamRole::kCopy);
  auto buffer = card.make_buffer<int>(100);
  pinned_buffer<int> staging(100);
  for (int i = 0; i < 100; ++i) staging[i] = 3 * i + 1;
  const DeviceCounts start = card.counts();
  Event copied(card.device(), card.stream().counters());
  Event read(card.device(), card.stream().counters());
  card.copy_stream().wait(read);  // never recorded: nothing to wait for
  copy_async(buffer.data(), staging.data(), 100, card.copy_stream());
  copied.record(card.copy_stream());
  card.stream().wait(copied);
  copy_async(staging.data(), buffer.data(), 50, card.stream());  // back, on the compute stream
  read.record(card.stream());
  DeviceCounts d = card.counts() - start;
  EXPECT_EQ(d.pinned_copies, 2u);
  EXPECT_EQ(d.copy_stream_copies, 1u);
  EXPECT_EQ(d.stream_waits, 2u);
  EXPECT_EQ(d.host_syncs, 0u);
  read.synchronize();
  EXPECT_EQ((card.counts() - start).host_syncs, 1u);
  const std::vector<int> back = to_host(buffer.data(), 100, card.stream());
  for (int i = 0; i < 100; ++i) ASSERT_EQ(back[i], 3 * i + 1) << i;
  EXPECT_NE(to_string(card.counts() - start).find("copy_stream_copies 1, stream_waits 2"),
            std::string::npos);
}

// Timing events (the next pass's chunks are paced by them): the card time between two records,
// here (cpu) the host time between them; events made without timing refuse to be timed.
TEST(DeviceCounters, TimingEventsMeasureTheTimeBetweenTheirRecords) {
  CardSet cards = CardSet::from_list("0");
  Card& card = cards.card(0);
  card.activate();
  Event begin(card.device(), nullptr, EventTiming::kOn);
  Event end(card.device(), nullptr, EventTiming::kOn);
  begin.record(card.stream());
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  end.record(card.stream());
  end.synchronize();  // on a card a just-recorded event may not have passed yet
  ASSERT_TRUE(end.ready());
  EXPECT_GE(end.seconds_since(begin), 0.019);
  EXPECT_LT(end.seconds_since(begin), 5.0);
  Event untimed(card.device());
  untimed.record(card.stream());
  EXPECT_THROW(untimed.seconds_since(begin), Error);
}

TEST(DeviceCounters, AllocationWhileACollectiveIsInFlightIsCountedAndFatalUnderTheCheck) {
  CardSet cards = CardSet::from_list("0");
  Card& card = cards.card(0);
  CardCounters& counters = *card.stream().counters();
  const bool was = device_check_enabled();
  set_device_check(false);
  counters.add_collective("all_reduce_sum", /*blocking=*/false);
  { auto a = card.make_buffer<float>(16); }
  EXPECT_EQ(card.counts().window_allocations, 1u);
  card.stream().synchronize();  // closes the window
  { auto b = card.make_buffer<float>(16); }
  EXPECT_EQ(card.counts().window_allocations, 1u);
  counters.add_collective("exchange_counts", /*blocking=*/true);  // returns complete: no window
  { auto c = card.make_buffer<float>(16); }
  EXPECT_EQ(card.counts().window_allocations, 1u);
  set_device_check(true);
  counters.add_collective("all_to_all_v", /*blocking=*/false);
  try {
    auto d = card.make_buffer<float>(16);
    FAIL() << "allocation inside the window was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("after all_to_all_v was enqueued"), std::string::npos)
        << e.what();
  }
  card.stream().synchronize();
  set_device_check(was);
}

// A pipeline wait (a late readback's full ring: the card still runs the later steps' work) leaves
// the collective window open; a host sync (and a wait counted as one) closes it.
TEST(DeviceCounters, APipelineWaitKeepsTheCollectiveWindowAHostSyncClosesIt) {
  CardCounters counters;
  counters.add_collective("all_to_all_v", /*blocking=*/false);
  counters.add_pipeline_wait();
  counters.add_host_wait(HostWait::kPipeline);
  EXPECT_STREQ(counters.add_allocation(), "all_to_all_v");
  EXPECT_EQ(counters.snapshot().pipeline_waits, 2u);
  EXPECT_EQ(counters.snapshot().host_syncs, 0u);
  counters.add_host_sync();
  EXPECT_EQ(counters.add_allocation(), nullptr);
  counters.add_collective("all_reduce_sum", /*blocking=*/false);
  EXPECT_STREQ(counters.add_allocation(), "all_reduce_sum");
  counters.add_host_wait(HostWait::kSync);
  EXPECT_EQ(counters.add_allocation(), nullptr);
  const DeviceCounts counts = counters.snapshot();
  EXPECT_EQ(counts.host_syncs, 2u);
  EXPECT_EQ(counts.pipeline_waits, 2u);
  EXPECT_EQ(counts.allocations, 4u);
  EXPECT_EQ(counts.window_allocations, 2u);
}

}  // namespace
}  // namespace gpubox::device
