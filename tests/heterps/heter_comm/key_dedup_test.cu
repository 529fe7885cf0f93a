// detail::KeyDedup, the fused dedup and owner plan under HeterComm, against a std::map oracle: the
// unique keys grouped by owner card (ascending inside each), each owner's first index, each
// occurrence's unique index, the segments in position order, the padded starts; sizes 0, 1, a
// sort run, past it, many merge levels; 1, 3 and 8 partitions. And the plan as a StepGraph:
// captured once, replayed over a new batch of the same size, equal to the eager run; padded
// (run_padded), equal to a plan over the live keys alone, with one live count or with a count per
// block (LiveSlots' blocked form: an owner's received blocks).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <tuple>
#include <vector>

#include "common/hash.hpp"
#include "heterps/device/card.hpp"
#include "heterps/device/memory.hpp"
#include "heterps/device/step_graph.hpp"
#include "heterps/heter_comm/detail/key_dedup.cuh"

namespace gpubox::heter_comm::detail {
namespace {

std::vector<uint64_t> random_batch(std::size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint64_t> keys(n);
  const uint64_t vocab = std::max<std::size_t>(1, n / 4);
  for (auto& k : keys) k = (rng() % vocab) * 0xbf58476d1ce4e5b9ULL + 1;
  // The extreme keys, repeated where the batch is long enough.
  if (n > 0) keys[rng() % n] = 0;
  if (n > 1) keys[rng() % n] = ~uint64_t{0};
  if (n > 16) keys[rng() % n] = 0;
  return keys;
}

struct Outputs {
  std::vector<uint64_t> unique;
  std::vector<position_t> starts, sorted_pos, occurrence_unique, owner_begin;
};

Outputs read(const KeyDedup& dedup, std::size_t n, std::size_t count, int partitions,
             const device::Stream& stream) {
  Outputs out;
  out.unique = device::to_host(dedup.unique_keys(), count, stream);
  out.starts = device::to_host(dedup.unique_start(), n + 1, stream);
  out.sorted_pos = device::to_host(dedup.sorted_positions(), n, stream);
  out.occurrence_unique = device::to_host(dedup.occurrence_unique(), n, stream);
  out.owner_begin = device::to_host(dedup.owner_begin(), partitions + 1, stream);
  return out;
}

class KeyDedupTest : public ::testing::TestWithParam<std::tuple<std::size_t, int>> {};

TEST_P(KeyDedupTest, GroupsUniqueKeysByOwnerAndMatchesAMapOracle) {
  const auto [n, partitions] = GetParam();
  device::CardSet cards = device::CardSet::from_list("0");
  device::Card& card = cards.card(0);
  card.activate();
  const std::vector<uint64_t> keys = random_batch(n, 3 + n);
  // Oracle: (owner, key) -> positions, in position order.
  std::map<std::pair<int, uint64_t>, std::vector<position_t>> oracle;
  for (std::size_t i = 0; i < n; ++i) {
    const int owner = partitions > 1 ? owner_card(keys[i], partitions) : 0;
    oracle[{owner, keys[i]}].push_back(static_cast<position_t>(i));
  }
  auto on_card = device::to_device(keys, card.memory(), card.stream());
  KeyDedup dedup(card, partitions);
  dedup.reserve(n);
  const device::DeviceCounts before = card.counts();
  dedup.run_async(on_card.data(), n, card.stream(), /*pad=*/true);
  const device::DeviceCounts used = card.counts() - before;
  EXPECT_EQ(used.allocations, 0u) << "reserved, a run allocates nothing";
  EXPECT_EQ(used.host_syncs, 0u);
  if (n > 0) {
    EXPECT_EQ(used.launches, 4u) << "prepare, sort, scan, record";
  }
  dedup.copy_count_async(card.stream());
  card.stream().synchronize();
  const std::size_t count = dedup.collect_count();
  ASSERT_EQ(count, oracle.size());
  const Outputs out = read(dedup, n, count, partitions, card.stream());
  std::size_t u = 0;
  std::vector<position_t> expected_begin(partitions + 1, 0);
  for (const auto& [owner_key, positions] : oracle) {
    const auto [owner, key] = owner_key;
    ASSERT_EQ(out.unique[u], key) << "unique " << u;
    for (int c = owner + 1; c <= partitions; ++c) expected_begin[c] = u + 1;
    const position_t start = out.starts[u];
    ASSERT_EQ(out.starts[u + 1] - start, positions.size()) << "segment of unique " << u;
    for (std::size_t j = 0; j < positions.size(); ++j) {
      EXPECT_EQ(out.sorted_pos[start + j], positions[j]) << "not in position order";
      EXPECT_EQ(out.occurrence_unique[positions[j]], u);
    }
    ++u;
  }
  EXPECT_EQ(out.owner_begin, expected_begin);
  for (std::size_t v = count + 1; v <= n; ++v) EXPECT_EQ(out.starts[v], n) << "pad " << v;
}

INSTANTIATE_TEST_SUITE_P(Sizes, KeyDedupTest,
                         ::testing::Combine(::testing::Values(0, 1, 16, 17, 2600, 70000),
                                            ::testing::Values(1, 2, 3, 8, 33)));

// Reserved once for the largest batch, smaller batches allocate nothing; and after
// run_unique_sorted, no scan ran: count_on_card() is null and the copied count is the batch's,
// not a stale word of the earlier run's buffers.
TEST(KeyDedup, ReservedOnceThenSmallerBatchesAndUniqueSortedAllocateNothing) {
  device::CardSet cards = device::CardSet::from_list("0");
  device::Card& card = cards.card(0);
  card.activate();
  KeyDedup dedup(card, 33);
  dedup.reserve(5000);
  for (const std::size_t n : {std::size_t{5000}, std::size_t{1200}, std::size_t{17}}) {
    const auto keys = random_batch(n, n);
    const std::set<uint64_t> distinct(keys.begin(), keys.end());
    auto on_card = device::to_device(keys, card.memory(), card.stream());
    const device::DeviceCounts start = card.counts();
    EXPECT_EQ(dedup.run(on_card.data(), n, card.stream()), distinct.size());
    EXPECT_EQ((card.counts() - start).allocations, 0u) << n << " keys";
    EXPECT_NE(dedup.count_on_card(), nullptr);
  }
  // Unique, ascending keys: fewer than the last scanned run's occurrences.
  std::vector<uint64_t> sorted = {0, 5, 9, 1000, ~uint64_t{0}};
  auto on_card = device::to_device(sorted, card.memory(), card.stream());
  const device::DeviceCounts start = card.counts();
  EXPECT_EQ(dedup.run_unique_sorted(on_card.data(), sorted.size(), card.stream()), sorted.size());
  EXPECT_EQ((card.counts() - start).allocations, 0u);
  EXPECT_EQ(dedup.count_on_card(), nullptr);
  dedup.copy_count_async(card.stream());
  card.stream().synchronize();
  EXPECT_EQ(dedup.collect_count(), sorted.size());
  EXPECT_EQ(device::to_host(dedup.unique_keys(), sorted.size(), card.stream()), sorted);
}

// Issue 31, item 3's way: with its sizes fixed, the plan holds no Thrust call, allocation or
// wait, so it captures into a StepGraph (capture refuses each of those) and a replay over the
// next batch, written into the same input buffer, equals the eager run.
TEST(KeyDedup, CapturedPlanReplaysOverANewBatchEqualToEager) {
  device::CardSet cards = device::CardSet::from_list("0");
  device::Card& card = cards.card(0);
  card.activate();
  const std::size_t n = 2600;
  const int partitions = 4;
  device::device_buffer<uint64_t> batch(n, card.memory(), card.stream());
  KeyDedup graphed(card, partitions);
  KeyDedup eager(card, partitions);
  graphed.reserve(n);
  eager.reserve(n);
  device::StepGraph graph("key plan");
  graph.capture(card.stream(), [&] { graphed.run_async(batch.data(), n, card.stream(), true); });
  EXPECT_EQ(graph.contents().launches, 4u);
  for (uint64_t seed : {11u, 12u}) {
    const auto keys = random_batch(n, seed);
    device::copy_async(batch.data(), keys.data(), n, card.stream());
    graph.replay(card.stream());
    eager.run_async(batch.data(), n, card.stream(), true);
    graphed.copy_count_async(card.stream());
    card.stream().synchronize();
    const std::size_t count = graphed.collect_count();
    eager.copy_count_async(card.stream());
    card.stream().synchronize();
    ASSERT_EQ(count, eager.collect_count());
    const Outputs a = read(graphed, n, count, partitions, card.stream());
    const Outputs b = read(eager, n, count, partitions, card.stream());
    EXPECT_EQ(a.unique, b.unique);
    EXPECT_EQ(a.starts, b.starts);
    EXPECT_EQ(a.sorted_pos, b.sorted_pos);
    EXPECT_EQ(a.occurrence_unique, b.occurrence_unique);
    EXPECT_EQ(a.owner_begin, b.owner_begin);
  }
}

// The padded plan (run_padded, HeterComm's fixed-size steps): captured once over the pass's
// largest batch, replayed with the live count read on the card, it describes the live keys as
// run_async over them alone does (the oracle), for live counts of 0, a few, most and all; the
// segments past the live count are empty and the dead positions' stale keys (0 among them)
// never join a live key.
TEST(KeyDedup, CapturedPaddedPlanEqualsAPlanOverTheLiveKeysOnly) {
  device::CardSet cards = device::CardSet::from_list("0");
  device::Card& card = cards.card(0);
  card.activate();
  const std::size_t n = 2600;
  const int partitions = 3;
  device::device_buffer<uint64_t> batch(n, card.memory(), card.stream());
  device::device_buffer<uint64_t> live(1, card.memory(), card.stream());
  KeyDedup padded(card, partitions);
  KeyDedup exact(card, partitions);
  padded.reserve(n);
  exact.reserve(n);
  device::StepGraph graph("padded key plan");
  graph.capture(card.stream(), [&] {
    padded.run_padded(batch.data(), n, LiveSlots{live.data(), n, 1}, card.stream());
  });
  EXPECT_EQ(graph.contents().launches, 4u);
  for (const uint64_t count : {uint64_t{0}, uint64_t{5}, uint64_t{1900}, uint64_t{n}}) {
    SCOPED_TRACE(count);
    const auto keys = random_batch(n, 21 + count);  // stale keys past `count`, 0 included
    device::copy_async(batch.data(), keys.data(), n, card.stream());
    device::copy_async(live.data(), &count, 1, card.stream());
    graph.replay(card.stream());
    const std::size_t unique = exact.run(batch.data(), count, card.stream());
    const auto live_count = device::to_host(padded.live_count_on_card(), 1, card.stream());
    ASSERT_EQ(live_count[0], unique);
    const Outputs a = read(padded, n, unique, partitions, card.stream());
    const Outputs b = read(exact, count, unique, partitions, card.stream());
    EXPECT_EQ(a.unique, b.unique);
    EXPECT_EQ(a.owner_begin, b.owner_begin);
    EXPECT_EQ(std::vector<position_t>(a.sorted_pos.begin(), a.sorted_pos.begin() + count),
              b.sorted_pos);
    EXPECT_EQ(
        std::vector<position_t>(a.occurrence_unique.begin(), a.occurrence_unique.begin() + count),
        b.occurrence_unique);
    // Starts: the live segments', then the live count for every segment past them.
    std::vector<position_t> want(b.starts.begin(), b.starts.begin() + unique + 1);
    want.resize(n + 1, static_cast<position_t>(count));
    EXPECT_EQ(a.starts, want);
  }
}

// LiveSlots' blocked form (an owner's received keys: a block per sending card, each led by its
// live count, `stride` apart): which positions are live and how many, against a host oracle,
// counts of 0, some, all and past the block (clipped to it) included.
TEST(LiveSlots, BlockedFormCountsEachBlocksLivePrefix) {
  const std::size_t block = 8;
  const std::size_t stride = block + 1;
  // [count, 8 keys] per block; the keys' words are never read as counts.
  const std::vector<uint64_t> counts = {3, 0, 8, 11, 1};
  std::vector<uint64_t> framed(counts.size() * stride, 99);
  for (std::size_t b = 0; b < counts.size(); ++b) framed[b * stride] = counts[b];
  const LiveSlots live{framed.data(), block, stride};
  std::size_t want_total = 0;
  for (std::size_t i = 0; i < counts.size() * block; ++i) {
    const bool want = i % block < std::min<uint64_t>(counts[i / block], block);
    EXPECT_EQ(live(i), want) << "position " << i;
    want_total += want ? 1 : 0;
    // total(n) over every prefix, a partial last block included.
    std::size_t prefix = 0;
    for (std::size_t j = 0; j <= i; ++j) prefix += j % block < counts[j / block] ? 1 : 0;
    EXPECT_EQ(live.total(i + 1), prefix) << "the first " << i + 1 << " positions";
  }
  EXPECT_EQ(live.total(counts.size() * block), want_total);
  EXPECT_EQ(want_total, 3u + 0 + 8 + 8 + 1);
  // The unpadded form: every position live.
  EXPECT_TRUE(LiveSlots{}(12345));
  EXPECT_EQ(LiveSlots{}.total(77), 77u);
}

// The padded plan over blocked live counts (HeterComm's owner merge over received blocks), as a
// step graph reading each step's counts at replay, describes the live keys exactly as run_async
// over those keys alone, in position order, does (the oracle), positions mapped between the two.
TEST(KeyDedup, CapturedPlanOverBlockedCountsEqualsAPlanOverTheLiveKeysOnly) {
  device::CardSet cards = device::CardSet::from_list("0");
  device::Card& card = cards.card(0);
  card.activate();
  const std::size_t block = 96;
  const std::size_t blocks = 4;
  const std::size_t n = block * blocks;
  const std::size_t stride = block + 1;
  const int partitions = 3;
  device::device_buffer<uint64_t> batch(n, card.memory(), card.stream());
  device::device_buffer<uint64_t> framed(blocks * stride, card.memory(), card.stream());
  device::device_buffer<uint64_t> compact(n, card.memory(), card.stream());
  KeyDedup padded(card, partitions);
  KeyDedup exact(card, partitions);
  padded.reserve(n);
  exact.reserve(n);
  device::StepGraph graph("blocked key plan");
  graph.capture(card.stream(), [&] {
    padded.run_padded(batch.data(), n, LiveSlots{framed.data(), block, stride}, card.stream());
  });
  const std::vector<std::vector<uint64_t>> steps = {
      {0, 0, 0, 0}, {5, 0, 96, 40}, {96, 96, 96, 96}, {1, 200, 0, 95}};
  for (std::size_t s = 0; s < steps.size(); ++s) {
    SCOPED_TRACE(s);
    const auto keys = random_batch(n, 40 + s);  // stale keys past each count, 0 among them
    std::vector<uint64_t> counts(blocks * stride, 0);
    std::vector<uint64_t> live_keys;
    std::vector<std::size_t> live_at;  // padded position of compact position i
    for (std::size_t b = 0; b < blocks; ++b) {
      counts[b * stride] = steps[s][b];
      for (std::size_t j = 0; j < std::min<uint64_t>(steps[s][b], block); ++j) {
        live_keys.push_back(keys[b * block + j]);
        live_at.push_back(b * block + j);
      }
    }
    const std::size_t count = live_keys.size();
    device::copy_async(batch.data(), keys.data(), n, card.stream());
    device::copy_async(framed.data(), counts.data(), counts.size(), card.stream());
    if (count > 0) device::copy_async(compact.data(), live_keys.data(), count, card.stream());
    graph.replay(card.stream());
    const std::size_t unique = exact.run(compact.data(), count, card.stream());
    ASSERT_EQ(device::to_host(padded.live_count_on_card(), 1, card.stream())[0], unique);
    const Outputs a = read(padded, n, unique, partitions, card.stream());
    const Outputs b = read(exact, count, unique, partitions, card.stream());
    EXPECT_EQ(a.unique, b.unique);
    EXPECT_EQ(a.owner_begin, b.owner_begin);
    for (std::size_t i = 0; i < count; ++i) {
      ASSERT_EQ(a.sorted_pos[i], live_at[b.sorted_pos[i]]) << "sorted position " << i;
      ASSERT_EQ(a.occurrence_unique[live_at[i]], b.occurrence_unique[i]) << "occurrence " << i;
    }
    std::vector<position_t> want(b.starts.begin(), b.starts.begin() + unique + 1);
    want.resize(n + 1, static_cast<position_t>(count));
    EXPECT_EQ(a.starts, want);
  }
}

#if !defined(GPUBOX_BACKEND_CUDA)
// The cpu twin's padded plan on a card of 3 threads (each thread's range of positions starting
// inside a block, PrepareSort and RecordLiveSegments taking a block's live count once) equals
// the same plan on a card of 1 thread, over blocked counts of 0, some, all and past a block.
TEST(KeyDedup, PaddedPlanOnTheCardsThreadsEqualsOneThread) {
  const std::size_t block = 700;
  const std::size_t blocks = 5;
  const std::size_t n = block * blocks;  // past parallel_for's serial limit
  const std::size_t stride = block + 1;
  const int partitions = 3;
  const auto keys = random_batch(n, 77);
  std::vector<uint64_t> counts(blocks * stride, 0);
  const uint64_t live_counts[blocks] = {0, 350, 700, 900, 1};
  for (std::size_t b = 0; b < blocks; ++b) counts[b * stride] = live_counts[b];
  std::vector<Outputs> outputs;
  std::vector<uint64_t> unique;
  for (const int threads : {1, 3}) {
    device::CardSet cards = device::CardSet::from_list("0", 0, 1, threads);
    device::Card& card = cards.card(0);
    card.activate();
    auto batch = device::to_device(keys, card.memory(), card.stream());
    auto framed = device::to_device(counts, card.memory(), card.stream());
    KeyDedup padded(card, partitions);
    padded.reserve(n);
    padded.run_padded(batch.data(), n, LiveSlots{framed.data(), block, stride}, card.stream());
    unique.push_back(device::to_host(padded.live_count_on_card(), 1, card.stream())[0]);
    outputs.push_back(read(padded, n, unique.back(), partitions, card.stream()));
  }
  ASSERT_EQ(unique[0], unique[1]);
  EXPECT_GT(unique[0], 0u);
  EXPECT_EQ(outputs[0].unique, outputs[1].unique);
  EXPECT_EQ(outputs[0].owner_begin, outputs[1].owner_begin);
  EXPECT_EQ(outputs[0].starts, outputs[1].starts);
  EXPECT_EQ(outputs[0].sorted_pos, outputs[1].sorted_pos);
  for (std::size_t i = 0; i < n; ++i) {  // a dead position's is not written
    if (i % block >= std::min<uint64_t>(live_counts[i / block], block)) continue;
    ASSERT_EQ(outputs[0].occurrence_unique[i], outputs[1].occurrence_unique[i]) << i;
  }
}
#endif

}  // namespace
}  // namespace gpubox::heter_comm::detail
