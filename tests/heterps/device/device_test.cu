// Backend layer: buffers, copies, parallel_for and the Thrust path, cards; the per-card counters,
// the memory registry and GPUBOX_DEVICE_CHECK, the scratch arena, reduce_into.
#include <gtest/gtest.h>
#include <omp.h>
#include <thrust/reduce.h>
#include <thrust/sort.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <thread>

#include "heterps/device/card.hpp"
#include "heterps/device/exec_policy.cuh"
#include "heterps/device/memory.hpp"
#include "heterps/device/memory_registry.hpp"
#include "heterps/device/parallel_for.cuh"
#include "heterps/device/reduce.cuh"
#include "heterps/device/scratch_arena.hpp"
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

// ---- the memory registry and GPUBOX_DEVICE_CHECK -------------------------------------------

#if !defined(GPUBOX_BACKEND_CUDA)
// The VmFlags of the mapping of /proc/self/smaps that holds `address` ("" when none does).
std::string vm_flags_at(const void* address) {
  const auto at = reinterpret_cast<uintptr_t>(address);
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    uintptr_t begin = 0, end = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> begin >> dash >> end && dash == '-') {
      inside = begin <= at && at < end;
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      return line;
    }
  }
  return "";
}

// The "begin-end" line of the mapping of /proc/self/maps that holds `address` ("" when none).
std::string mapping_of(const void* address) {
  const auto at = reinterpret_cast<uintptr_t>(address);
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    uintptr_t begin = 0, end = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> begin >> dash >> end && dash == '-' && begin <= at && at < end) {
      return line.substr(0, line.find(' '));
    }
  }
  return "";
}

// cpu backend: Pages::kHuge blocks of 2 MiB and more (hash table slots, row pool pages) start on
// a 2 MiB boundary, each one mapping of exactly its (page-rounded) bytes advised for transparent
// huge pages (the kernel keeps the tail past the last whole 2 MiB span on small pages), given back
// whole when freed; smaller ones, and Pages::kSmall blocks of any size, are plain heap memory
// without the advice.
TEST(CardMemory, HugePageBlocksStartOnHugePagesAndHoldEveryByte) {
  GPUBOX_REQUIRE_CARDS(1);
  CardSet cards = CardSet::from_list("0");
  Card& card = cards.card(0);
  constexpr std::size_t kHuge = std::size_t{2} << 20;
  const bool thp = std::ifstream("/sys/kernel/mm/transparent_hugepage/enabled").good();
  for (const std::size_t bytes : {kHuge - 64, kHuge, kHuge + 4096 + 8, 2 * kHuge + kHuge / 4}) {
    SCOPED_TRACE(bytes);
    {
      // The default: no advice, whatever the size (blocks that come and go reuse heap memory).
      void* plain = card.memory().allocate(bytes, card.stream());
      EXPECT_EQ(vm_flags_at(plain).find(" hg"), std::string::npos) << vm_flags_at(plain);
      card.memory().deallocate(plain, bytes, card.stream());
    }
    auto* block =
        static_cast<unsigned char*>(card.memory().allocate(bytes, card.stream(), Pages::kHuge));
    ASSERT_NE(block, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(block) % 64, 0u);
    const MemoryRange range = find_memory(block + bytes - 1);
    EXPECT_EQ(range.kind, MemoryKind::kCard);
    EXPECT_EQ(range.bytes, bytes);
    for (std::size_t i = 0; i < bytes; ++i) block[i] = static_cast<unsigned char>(i * 7 + 3);
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < bytes; ++i) {
      wrong += block[i] != static_cast<unsigned char>(i * 7 + 3);
    }
    EXPECT_EQ(wrong, 0u);
    if (bytes >= kHuge) {
      EXPECT_EQ(reinterpret_cast<uintptr_t>(block) % kHuge, 0u);
      // Where smaps shows VmFlags (not every sandbox does) and the kernel has THP: advised,
      // first byte to last, one mapping.
      if (thp && !vm_flags_at(block).empty()) {
        EXPECT_NE(vm_flags_at(block).find(" hg"), std::string::npos) << vm_flags_at(block);
        EXPECT_EQ(vm_flags_at(block + bytes - 1), vm_flags_at(block));
        EXPECT_EQ(mapping_of(block), mapping_of(block + bytes - 1)) << "one mapping";
      }
    }
    const std::string first = mapping_of(block);
    const std::string last = mapping_of(block + bytes - 1);
    card.memory().deallocate(block, bytes, card.stream(), Pages::kHuge);
    EXPECT_EQ(find_memory(block).kind, MemoryKind::kPageable);
    if (bytes >= kHuge) {  // unmapped whole: neither end is in the block's mapping any more
      EXPECT_NE(mapping_of(block), first);
      EXPECT_NE(mapping_of(block + bytes - 1), last);
    }
  }
  EXPECT_EQ(card.memory().bytes_in_use(), 0u);
}
#endif

TEST(MemoryRegistry, TellsCardPinnedAndPageableMemoryApart) {
  GPUBOX_REQUIRE_CARDS(2);
  CardSet cards = CardSet::from_list("0,1");
  auto on_one = cards.card(1).make_buffer<double>(100);
  pinned_buffer<char> pinned(64);
  std::vector<int> pageable(10);
  const MemoryRange card_range = find_memory(on_one.data() + 99);  // inside, last element
  EXPECT_EQ(card_range.kind, MemoryKind::kCard);
  EXPECT_EQ(card_range.device, cards.card(1).device());
  EXPECT_EQ(card_range.bytes, 100 * sizeof(double));
  EXPECT_EQ(find_memory(on_one.data() + 100).kind, MemoryKind::kPageable);  // one past the end
  EXPECT_EQ(find_memory(pinned.data() + 63).kind, MemoryKind::kPinned);
  EXPECT_EQ(find_memory(pageable.data()).kind, MemoryKind::kPageable);
  const void* freed = on_one.data();
  on_one.release();
  EXPECT_EQ(find_memory(freed).kind, MemoryKind::kPageable);
}

TEST(DeviceCheck, CopiesMustStayInsideTheStreamsCardMemory) {
  GPUBOX_REQUIRE_CARDS(2);
  CardSet cards = CardSet::from_list("0,1");
  Card& a = cards.card(0);
  Card& b = cards.card(1);
  auto on_a = a.make_buffer<float>(10);
  auto on_b = b.make_buffer<float>(10);
  std::vector<float> host(20, 1.0f);
  const bool was = device_check_enabled();
  set_device_check(true);
  auto expect_error = [](const std::function<void()>& fn, const std::string& needle) {
    try {
      fn();
      ADD_FAILURE() << "accepted; wanted an error containing '" << needle << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  // Fine: host -> own card, card -> peer card on either card's stream.
  copy_async(on_a.data(), host.data(), 10, a.stream());
  copy_async(on_b.data(), on_a.data(), 10, b.stream());
  // A host copy into card 1's memory on card 0's stream.
  expect_error([&] { copy_async(on_b.data(), host.data(), 10, a.stream()); },
               "reaches card 1 memory");
#if !defined(GPUBOX_BACKEND_CUDA)  // a stream of a card the machine may not have
  // A peer copy between cards 0 and 1 on the stream of neither (a third card's).
  expect_error(
      [&] {
        Stream third(7, nullptr);
        copy_async(on_b.data(), on_a.data(), 10, third);
      },
      "touches none of card 7's memory");
#endif
  // 11 floats into a 10-float allocation.
  expect_error([&] { copy_async(on_a.data(), host.data(), 11, a.stream()); },
               "runs past the end of its allocation");
  // A memset of card 0's memory on card 1's stream.
  expect_error([&] { memset_bytes_async(on_a.data(), 0, on_a.bytes(), b.stream()); },
               "must be card 1 memory, but it is card 0 memory");
  set_device_check(was);
}

// ---- the scratch arena ----------------------------------------------------------------------

// The scratch arena behind Thrust's temporaries: a request that does not fit is a one-off
// allocation, the arena then grows to the peak demand, and the same pattern afterwards
// allocates nothing; one-off blocks are returned to the card.
TEST(ScratchArena, GrowsToPeakDemandThenReuses) {
  CardSet cards = CardSet::from_list("0");
  Card& card = cards.card(0);
  const std::size_t base = card.memory().bytes_in_use();
  {
    ScratchArena arena(card.memory(), card.stream());
    auto one_call = [&] {  // what one sort asks for: two live blocks, then both returned
      char* a = arena.allocate(1000);
      char* b = arena.allocate(5000);
      EXPECT_NE(a, b);
      a[0] = 1;
      b[4999] = 2;
      arena.deallocate(b, 5000);
      arena.deallocate(a, 1000);
    };
    one_call();
    EXPECT_EQ(arena.overflow_allocations(), 2u);
    EXPECT_GE(arena.bytes(), 6000u);
    for (int i = 0; i < 5; ++i) one_call();
    EXPECT_EQ(arena.overflow_allocations(), 2u) << "steady state allocated again";
    char* big = arena.allocate(100000);  // a bigger step: one more one-off, then it fits
    arena.deallocate(big, 100000);
    EXPECT_EQ(arena.overflow_allocations(), 3u);
    big = arena.allocate(100000);
    arena.deallocate(big, 100000);
    EXPECT_EQ(arena.overflow_allocations(), 3u);
    char* empty = arena.allocate(0);  // size 0 is legal and fits
    arena.deallocate(empty, 0);
    EXPECT_EQ(arena.overflow_allocations(), 3u);
    // reserve() grows an idle arena at once, so a later bigger call needs no one-off block.
    arena.reserve(400000);
    EXPECT_GE(arena.bytes(), 400000u);
    big = arena.allocate(400000);
    arena.deallocate(big, 400000);
    EXPECT_EQ(arena.overflow_allocations(), 3u);
  }
  EXPECT_EQ(card.memory().bytes_in_use(), base) << "the arena leaked card memory";
}

TEST(ScratchArena, EveryThrustCallOnACardStreamUsesTheCardsArena) {
  CardSet cards = CardSet::from_list("0");
  Card& card = cards.card(0);
  card.activate();
  std::vector<uint64_t> host(1 << 18);
  std::mt19937_64 rng(5);
  for (auto& v : host) v = rng();
  auto keys = to_device(host, card.memory(), card.stream());
  const std::size_t before = card.scratch().overflow_allocations();
  thrust::sort(exec_policy(card.stream()), keys.begin(), keys.end());
  const DeviceCounts start = card.counts();
  host = to_host(keys);
  keys = to_device(host, card.memory(), card.stream());
  const DeviceCounts mid = card.counts();
  thrust::sort(exec_policy(card.stream()), keys.begin(), keys.end());  // same size again
  EXPECT_EQ((card.counts() - mid).allocations, 0u) << "the second sort allocated";
  EXPECT_GE(card.scratch().overflow_allocations(), before);
  (void)start;
}

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
