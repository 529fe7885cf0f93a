#include "common/hash.hpp"

#include <gtest/gtest.h>

#include <random>
#include <unordered_set>
#include <vector>

namespace gpubox {
namespace {

TEST(Hash, MixersAreBijectiveOnSample) {
  std::mt19937_64 rng(1);
  std::unordered_set<uint64_t> a, b;
  for (int i = 0; i < 100000; ++i) {
    uint64_t k = rng();
    a.insert(mix64(k));
    b.insert(fmix64(k));
  }
  EXPECT_EQ(a.size(), 100000u);
  EXPECT_EQ(b.size(), 100000u);
}

TEST(Hash, OwnerCardIsBalancedAndIndependentOfShard) {
  const int cards = 8;
  const uint32_t shards = 8;
  std::vector<std::vector<int>> joint(cards, std::vector<int>(shards, 0));
  const int n = 160000;
  for (uint64_t k = 1; k <= static_cast<uint64_t>(n); ++k) {  // sequential keys: worst case
    joint[owner_card(k, cards)][host_shard(k, shards)]++;
  }
  const double expect = double(n) / (cards * shards);
  for (auto& row : joint)
    for (int c : row) EXPECT_NEAR(c, expect, expect * 0.1);
}

TEST(Hash, UnitFloatRange) {
  EXPECT_EQ(unit_float(0), 0.0f);
  EXPECT_LT(unit_float(~0ULL), 1.0f);
}

}  // namespace
}  // namespace gpubox
