// RowPool: batch allocation (candidates + commit), release and reuse, growth that keeps rows.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "heterps/device/card.hpp"
#include "heterps/device/memory.hpp"
#include "heterps/sparse/row_pool.hpp"

namespace gpubox::sparse {
namespace {

using device::Card;
using device::CardSet;
using device::to_device;
using device::to_host;

class RowPoolTest : public ::testing::Test {
 protected:
  RowPoolTest() : cards_(CardSet::from_list("0")) { card().activate(); }
  Card& card() { return cards_.card(0); }
  CardSet cards_;
};

std::vector<row_index_t> allocate(Card& card, RowPool& pool, std::size_t n) {
  auto out = card.make_buffer<row_index_t>(n);
  pool.allocate(out.data(), n, card.stream());
  return to_host(out);
}

TEST_F(RowPoolTest, AllocatesDistinctRowsAndGrowsKeepingContents) {
  RowPool pool(card(), /*stride=*/5, /*initial_rows=*/0);
  EXPECT_EQ(pool.capacity(), 0u);
  EXPECT_EQ(pool.memory_bytes(), 0u);
  const auto first = allocate(card(), pool, 10);
  ASSERT_EQ(first.size(), 10u);
  std::vector<float> values(10 * 5);
  std::iota(values.begin(), values.end(), 1.0f);
  for (std::size_t i = 0; i < first.size(); ++i) {
    device::copy_async(pool.rows() + first[i] * 5, values.data() + i * 5, 5, card().stream());
  }
  // Grow several times; the first rows keep their index and contents, new rows are zero.
  std::vector<row_index_t> all = first;
  for (std::size_t n : {1, 1, 100, 1000}) {
    const auto more = allocate(card(), pool, n);
    all.insert(all.end(), more.begin(), more.end());
  }
  std::set<row_index_t> distinct(all.begin(), all.end());
  EXPECT_EQ(distinct.size(), all.size());
  EXPECT_EQ(pool.in_use(), all.size());
  EXPECT_GE(pool.capacity(), all.size());
  EXPECT_LT(*distinct.rbegin(), pool.capacity());
  const auto rows = to_host(pool.rows(), pool.capacity() * 5, card().stream());
  for (std::size_t i = 0; i < first.size(); ++i) {
    for (int j = 0; j < 5; ++j) ASSERT_EQ(rows[first[i] * 5 + j], values[i * 5 + j]);
  }
  for (std::size_t i = first.size(); i < all.size(); ++i) {
    for (int j = 0; j < 5; ++j) ASSERT_EQ(rows[all[i] * 5 + j], 0.0f);
  }
}

TEST_F(RowPoolTest, CommitTakesExactlyTheMarkedCandidates) {
  RowPool pool(card(), /*stride=*/0, /*initial_rows=*/64);
  EXPECT_EQ(pool.free_count(), 64u);
  for (std::size_t n : {0, 1, 17, 64}) {
    SCOPED_TRACE(n);
    pool.clear(card().stream());
    const auto candidates = to_host(pool.peek_free(n), n, card().stream());
    std::mt19937 rng(n);
    std::vector<uint8_t> used(n);
    for (auto& u : used) u = rng() % 2;
    auto d_used = to_device(used, card().memory(), card().stream());
    const std::size_t taken = pool.commit_allocation(d_used.data(), n, card().stream());
    const std::size_t marked = std::count(used.begin(), used.end(), 1);
    EXPECT_EQ(taken, marked);
    EXPECT_EQ(pool.in_use(), marked);
    // The untaken candidates are free again: the next allocation of all free rows returns
    // them, and never a taken one.
    std::set<row_index_t> taken_rows;
    for (std::size_t i = 0; i < n; ++i) {
      if (used[i]) taken_rows.insert(candidates[i]);
    }
    const auto rest = allocate(card(), pool, pool.free_count());
    for (row_index_t r : rest) EXPECT_EQ(taken_rows.count(r), 0u) << r;
    EXPECT_EQ(rest.size() + taken_rows.size(), 64u);
  }
  EXPECT_THROW(pool.peek_free(65), Error);
}

TEST_F(RowPoolTest, ReleasedRowsAreReusedAndInvalidEntriesSkipped) {
  RowPool pool(card(), /*stride=*/3, /*initial_rows=*/0);
  auto rows = allocate(card(), pool, 100);
  const std::size_t capacity = pool.capacity();
  std::vector<row_index_t> release(rows.begin(), rows.begin() + 40);
  release.push_back(kInvalidRow);
  release.insert(release.begin(), kInvalidRow);
  auto d_release = to_device(release, card().memory(), card().stream());
  EXPECT_EQ(pool.release(d_release.data(), release.size(), card().stream()), 40u);
  EXPECT_EQ(pool.in_use(), 60u);
  const auto again = allocate(card(), pool, 40 + (capacity - 100));
  EXPECT_EQ(pool.capacity(), capacity);  // reuse, no growth
  std::set<row_index_t> reused(again.begin(), again.end());
  for (std::size_t i = 0; i < 40; ++i) EXPECT_EQ(reused.count(rows[i]), 1u) << rows[i];
  // Releasing more rows than are in use is a clear error, not a corrupt free list.
  std::vector<row_index_t> too_many(pool.capacity() + 1, 0);
  auto d_too_many = to_device(too_many, card().memory(), card().stream());
  EXPECT_THROW(pool.release(d_too_many.data(), too_many.size(), card().stream()), Error);
}

TEST_F(RowPoolTest, MoveKeepsState) {
  RowPool pool(card(), 2, 8);
  allocate(card(), pool, 3);
  RowPool moved = std::move(pool);
  EXPECT_EQ(moved.in_use(), 3u);
  EXPECT_EQ(moved.capacity(), 8u);
  EXPECT_EQ(moved.stride(), 2);
}

}  // namespace
}  // namespace gpubox::sparse
