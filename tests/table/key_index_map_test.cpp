// KeyIndexMap (open addressing, backward-shift deletion) against std::unordered_map under
// seeded random insert/erase churn, including clustered keys and growth; RowArena's compaction
// (rows moved down, chunks freed) against a map of each row's contents, re-pointed through
// KeyIndexMap::assign as the shard does.
#include "table/key_index_map.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <unordered_map>

#include "table/detail/row_arena.hpp"

namespace gpubox::table::detail {
namespace {

TEST(KeyIndexMap, RandomChurnMatchesUnorderedMap) {
  for (uint64_t key_space : {8ull, 1000ull, 1ull << 40}) {
    KeyIndexMap map;
    std::unordered_map<uint64_t, uint32_t> oracle;
    std::mt19937_64 rng(key_space);
    for (int step = 0; step < 200000; ++step) {
      const uint64_t key = rng() % key_space;
      const bool present = oracle.count(key) > 0;
      switch (rng() % 3) {
        case 0:
          if (!present) {
            const uint32_t value = static_cast<uint32_t>(rng() % 1000000);
            map.insert(key, value);
            oracle[key] = value;
          }
          break;
        case 1:
          ASSERT_EQ(map.erase(key), present ? oracle[key] : KeyIndexMap::kAbsent);
          oracle.erase(key);
          break;
        default:
          ASSERT_EQ(map.find(key), present ? oracle[key] : KeyIndexMap::kAbsent);
      }
      ASSERT_EQ(map.size(), oracle.size());
    }
    std::size_t visited = 0;
    map.for_each([&](uint64_t key, uint32_t value) {
      ++visited;
      EXPECT_EQ(oracle.at(key), value);
    });
    EXPECT_EQ(visited, oracle.size());
    map.clear();
    EXPECT_EQ(map.size(), 0u);
    EXPECT_EQ(map.find(1), KeyIndexMap::kAbsent);
  }
}

TEST(KeyIndexMap, ZeroAndMaxKeysAreOrdinaryKeys) {
  KeyIndexMap map;
  map.insert(0, 5);
  map.insert(~uint64_t{0}, 6);
  EXPECT_EQ(map.find(0), 5u);
  EXPECT_EQ(map.find(~uint64_t{0}), 6u);
  EXPECT_EQ(map.erase(0), 5u);
  EXPECT_EQ(map.find(0), KeyIndexMap::kAbsent);
  EXPECT_EQ(map.find(~uint64_t{0}), 6u);
}

TEST(KeyIndexMap, ReserveSizesTheMapOnceForItsKeys) {
  KeyIndexMap map;
  map.reserve(1000);  // rounded up to 1024
  ASSERT_EQ(map.capacity(), 1024u);
  map.reserve(10);  // never shrinks
  ASSERT_EQ(map.capacity(), 1024u);
  // Growth fill 0.7: 716 keys fit in 1024 slots, the 717th grows the map.
  for (uint64_t k = 0; k < 716; ++k)
    map.insert(k * 0x9e3779b97f4a7c15ULL, static_cast<uint32_t>(k));
  EXPECT_EQ(map.capacity(), 1024u);
  map.insert(~uint64_t{0}, 716);
  EXPECT_EQ(map.capacity(), 2048u);
  for (uint64_t k = 0; k < 716; ++k) EXPECT_EQ(map.find(k * 0x9e3779b97f4a7c15ULL), k);
  EXPECT_EQ(map.find(~uint64_t{0}), 716u);
}

// Rows allocated and released at random (sizes 0, 1, a chunk, a chunk + 1 and many chunks
// live), then compacted: every live row keeps its floats, epoch and flags at its new index, the
// chunks come down to the fewest that hold the live rows, and allocation goes on from there.
TEST(RowArena, CompactionKeepsEveryLiveRowAndFreesTheEmptiedChunks) {
  constexpr int32_t kStride = 3;
  constexpr uint32_t kChunk = 16;
  std::mt19937_64 rng(71);
  for (const std::size_t live : {std::size_t{0}, std::size_t{1}, std::size_t{kChunk},
                                 std::size_t{kChunk + 1}, std::size_t{5 * kChunk + 3}}) {
    SCOPED_TRACE(live);
    RowArena arena(kStride, kChunk);
    KeyIndexMap index;  // key -> arena index
    std::unordered_map<uint64_t, std::vector<float>> rows;
    std::unordered_map<uint64_t, uint32_t> epochs;
    // 8 chunks' worth of rows, then all but `live` of them released at random.
    std::vector<uint64_t> keys;
    for (uint64_t key = 0; key < 8 * kChunk; ++key) {
      const uint32_t i = arena.allocate(static_cast<uint32_t>(key));
      for (int32_t f = 0; f < kStride; ++f) arena.row(i)[f] = static_cast<float>(rng() % 1000);
      arena.set_pinned(i, key % 2 == 0);
      if (key % 3 == 0) arena.set_disk_copy(i, key % 5 == 0);
      index.insert(key, i);
      rows[key].assign(arena.row(i), arena.row(i) + kStride);
      epochs[key] = static_cast<uint32_t>(key);
      keys.push_back(key);
    }
    std::shuffle(keys.begin(), keys.end(), rng);
    for (std::size_t k = live; k < keys.size(); ++k) {
      arena.release(index.erase(keys[k]));
      rows.erase(keys[k]);
    }
    ASSERT_EQ(arena.live_rows(), live);
    // The shard's way: the keys of the rows past the boundary, re-pointed as they move.
    const uint32_t boundary = arena.compact_boundary();
    ASSERT_NE(boundary, RowArena::kNoCompaction);
    std::unordered_map<uint32_t, uint64_t> key_at;
    index.for_each([&](uint64_t key, uint32_t i) {
      if (i >= boundary) key_at[i] = key;
    });
    std::size_t moved = 0;
    arena.compact([&](uint32_t from, uint32_t to) {
      ASSERT_TRUE(key_at.count(from)) << from;
      EXPECT_LT(to, boundary);
      index.assign(key_at.at(from), to);
      ++moved;
    });
    EXPECT_EQ(moved, key_at.size());
    EXPECT_EQ(arena.live_rows(), live);
    EXPECT_EQ(arena.allocated_row_bytes(),
              (live + kChunk - 1) / kChunk * kChunk * (kStride * sizeof(float) + 4));
    EXPECT_EQ(arena.compact_boundary(), RowArena::kNoCompaction);
    index.for_each([&](uint64_t key, uint32_t i) {
      EXPECT_EQ(std::vector<float>(arena.row(i), arena.row(i) + kStride), rows.at(key)) << key;
      EXPECT_EQ(arena.epoch(i), epochs.at(key));
      EXPECT_EQ(arena.pinned(i), key % 2 == 0);
      EXPECT_EQ(arena.disk_copy(i), key % 3 == 0);
      EXPECT_EQ(arena.disk_copy_clean(i), key % 3 == 0 && key % 5 == 0);
    });
    // Allocation reuses the holes left below the boundary, then grows by chunks again.
    std::unordered_map<uint32_t, int> taken;
    index.for_each([&](uint64_t, uint32_t i) { ++taken[i]; });
    for (std::size_t k = 0; k < 2 * kChunk; ++k) {
      const uint32_t i = arena.allocate(1);
      EXPECT_EQ(taken[i]++, 0) << "index " << i << " handed out twice";
    }
    EXPECT_EQ(arena.live_rows(), live + 2 * kChunk);
  }
}

}  // namespace
}  // namespace gpubox::table::detail
