// KeyIndexMap (open addressing, backward-shift deletion) against std::unordered_map under
// seeded random insert/erase churn, including clustered keys and growth.
#include "table/detail/key_index_map.hpp"

#include <gtest/gtest.h>

#include <random>
#include <unordered_map>

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

}  // namespace
}  // namespace gpubox::table::detail
