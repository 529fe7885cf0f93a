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

}  // namespace
}  // namespace gpubox::table::detail
