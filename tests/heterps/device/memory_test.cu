// The device layer's memory: huge-page blocks of the cpu backend, the memory registry that tells
// card, pinned and pageable memory apart, GPUBOX_DEVICE_CHECK's checks of copies, and the scratch
// arena behind Thrust's temporaries.
#include <gtest/gtest.h>
#include <thrust/sort.h>

#include <cstdint>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "heterps/device/card.hpp"
#include "heterps/device/exec_policy.cuh"
#include "heterps/device/memory.hpp"
#include "heterps/device/memory_registry.hpp"
#include "heterps/device/scratch_arena.hpp"
#include "tests/heterps/device/test_cards.hpp"

namespace gpubox::device {
namespace {

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

// "" when every byte of `got` is `want`; else how many are not and the first of them.
std::string bytes_unlike(const std::vector<char>& got, char want) {
  std::size_t wrong = 0;
  std::size_t first = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want && wrong++ == 0) first = i;
  }
  if (wrong == 0) return "";
  return std::to_string(wrong) + " of " + std::to_string(got.size()) + " bytes are not " +
         std::to_string(want) + "; the first, at " + std::to_string(first) + ", is " +
         std::to_string(got[first]);
}

// The scratch arena behind Thrust's temporaries: a request that does not fit is a one-off
// allocation, the arena then grows to the peak demand, and the same pattern afterwards
// allocates nothing; one-off blocks are returned to the card.
TEST(ScratchArena, GrowsToPeakDemandThenReuses) {
  CardSet cards = CardSet::from_list("0");
  Card& card = cards.card(0);
  card.activate();
  const std::size_t base = card.memory().bytes_in_use();
  const DeviceCounts counts_before = card.counts();
  {
    ScratchArena arena(card.memory(), card.stream());
    // The blocks are card memory (a GPU's: the host may not touch them): each is filled on the
    // card with its own byte and read back whole, so blocks that overlap or that are not the
    // card's memory fail here.
    auto one_call = [&] {  // what one sort asks for: two live blocks, then both returned
      char* a = arena.allocate(1000);
      char* b = arena.allocate(5000);
      memset_bytes_async(a, 1, 1000, card.stream());
      memset_bytes_async(b, 2, 5000, card.stream());
      EXPECT_EQ(bytes_unlike(to_host(a, 1000, card.stream()), 1), "") << "the 1000-byte block";
      EXPECT_EQ(bytes_unlike(to_host(b, 5000, card.stream()), 2), "") << "the 5000-byte block";
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
    // Its own count of card allocations and frees is the card's (nothing else allocated here):
    // 3 one-offs and their frees, 3 growths (6000, 100000, 400000) and 2 frees of the old block.
    const DeviceCounts made = card.counts() - counts_before;
    EXPECT_EQ(arena.card_allocations(), made.allocations);
    EXPECT_EQ(arena.card_frees(), made.frees);
    EXPECT_EQ(arena.card_allocations(), 6u);
    EXPECT_EQ(arena.card_frees(), 5u);
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

}  // namespace
}  // namespace gpubox::device
