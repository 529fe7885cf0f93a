// RowPool: batch allocation (candidates + commit), release and reuse, growth by pages that keeps
// rows and never copies them, coalesced gather/scatter against an oracle.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <set>
#include <unordered_map>
#include <vector>

#include "heterps/card_table/row_pool.hpp"
#include "heterps/device/card.hpp"
#include "heterps/device/memory.hpp"

namespace gpubox::card_table {
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

// Every row of the pool, packed in index order (through gather).
std::vector<float> all_rows(Card& card, const RowPool& pool) {
  std::vector<row_index_t> every(pool.capacity());
  std::iota(every.begin(), every.end(), row_index_t{0});
  auto d_every = to_device(every, card.memory(), card.stream());
  auto out = card.make_buffer<float>(pool.capacity() * pool.stride());
  pool.gather(d_every.data(), every.size(), out.data(), card.stream());
  return to_host(out);
}

TEST_F(RowPoolTest, AllocatesDistinctRowsAndGrowsByPagesKeepingContents) {
  RowPool pool(card(), /*stride=*/5, /*initial_rows=*/0, /*page_rows=*/16);
  EXPECT_EQ(pool.capacity(), 0u);
  EXPECT_EQ(pool.memory_bytes(), 0u);
  EXPECT_EQ(pool.page_bytes(), 16u * 5 * sizeof(float));
  const auto first = allocate(card(), pool, 10);
  ASSERT_EQ(first.size(), 10u);
  EXPECT_EQ(pool.capacity(), 16u);  // one page
  std::vector<float> values(10 * 5);
  std::iota(values.begin(), values.end(), 1.0f);
  auto d_first = to_device(first, card().memory(), card().stream());
  auto d_values = to_device(values, card().memory(), card().stream());
  pool.scatter(d_values.data(), d_first.data(), first.size(), card().stream());
  // Grow over many pages; the first rows keep their index and contents, new rows are zero.
  std::vector<row_index_t> all = first;
  for (std::size_t n : {1, 1, 5, 100, 1000}) {
    const auto more = allocate(card(), pool, n);
    all.insert(all.end(), more.begin(), more.end());
    EXPECT_EQ(pool.capacity() % pool.page_rows(), 0u);
    EXPECT_LT(pool.capacity() - pool.in_use(), pool.page_rows())
        << "grew more than a page past the need";
  }
  std::set<row_index_t> distinct(all.begin(), all.end());
  EXPECT_EQ(distinct.size(), all.size());
  EXPECT_EQ(pool.in_use(), all.size());
  EXPECT_GE(pool.capacity(), all.size());
  EXPECT_EQ(pool.pages(), pool.capacity() / 16);
  EXPECT_LT(*distinct.rbegin(), pool.capacity());
  const auto rows = all_rows(card(), pool);
  for (std::size_t i = 0; i < first.size(); ++i) {
    for (int j = 0; j < 5; ++j) ASSERT_EQ(rows[first[i] * 5 + j], values[i * 5 + j]);
  }
  for (std::size_t i = first.size(); i < all.size(); ++i) {
    for (int j = 0; j < 5; ++j) ASSERT_EQ(rows[all[i] * 5 + j], 0.0f);
  }
}

// Growth never copies rows: the card holds the pages, a page table and the free list, and at no
// moment more than that plus the free list's own growth (a flat array that grows 1.5x by copying
// would peak at 2.5x the rows).
TEST_F(RowPoolTest, GrowthPeakIsThePagesNotTwoCopies) {
  const std::size_t before = card().memory().bytes_in_use();
  RowPool pool(card(), /*stride=*/32, /*initial_rows=*/0, /*page_rows=*/256);
  pool.reserve_index(200000);  // a budgeted store plans its index once
  const std::size_t index_bytes = card().memory().bytes_in_use() - before;
  auto out = card().make_buffer<row_index_t>(5000);
  for (int step = 0; step < 40; ++step) {
    pool.allocate(out.data(), 5000, card().stream());
    const std::size_t peak = card().memory().peak_bytes() - before - out.bytes();
    ASSERT_LE(peak, pool.pages() * pool.page_bytes() + index_bytes) << "step " << step;
  }
  EXPECT_EQ(pool.in_use(), 200000u);
  EXPECT_EQ(pool.memory_bytes(), card().memory().bytes_in_use() - before - out.bytes());
}

TEST_F(RowPoolTest, GatherAndScatterMatchAnOracle) {
  for (int32_t stride : {1, 3, 17}) {
    SCOPED_TRACE(stride);
    RowPool pool(card(), stride, /*initial_rows=*/0, /*page_rows=*/8);
    const auto rows = allocate(card(), pool, 100);
    std::mt19937 rng(stride);
    std::unordered_map<row_index_t, std::vector<float>> oracle;
    // Several scatters of random subsets, in random order; rows written last win.
    for (int round = 0; round < 4; ++round) {
      std::vector<row_index_t> subset = rows;
      std::shuffle(subset.begin(), subset.end(), rng);
      subset.resize(round == 0 ? subset.size() : rng() % subset.size() + 1);
      std::vector<float> values(subset.size() * stride);
      for (float& v : values) v = static_cast<float>(rng() % 1000) / 8.0f;
      for (std::size_t i = 0; i < subset.size(); ++i) {
        oracle[subset[i]].assign(values.begin() + i * stride, values.begin() + (i + 1) * stride);
      }
      auto d_subset = to_device(subset, card().memory(), card().stream());
      auto d_values = to_device(values, card().memory(), card().stream());
      pool.scatter(d_values.data(), d_subset.data(), subset.size(), card().stream());
    }
    std::vector<row_index_t> ask;
    for (const auto& [row, value] : oracle) ask.push_back(row);
    ask.push_back(ask.front());  // a row read twice
    auto d_ask = to_device(ask, card().memory(), card().stream());
    auto d_out = card().make_buffer<float>(ask.size() * stride);
    pool.gather(d_ask.data(), ask.size(), d_out.data(), card().stream());
    const auto out = to_host(d_out);
    for (std::size_t i = 0; i < ask.size(); ++i) {
      for (int32_t f = 0; f < stride; ++f) ASSERT_EQ(out[i * stride + f], oracle[ask[i]][f]);
    }
    pool.gather(d_ask.data(), 0, d_out.data(), card().stream());  // n = 0: nothing
  }
}

TEST_F(RowPoolTest, PageRowsMustBeAPowerOfTwo) {
  EXPECT_THROW(RowPool(card(), 4, 0, 12), Error);
  EXPECT_EQ(RowPool(card(), 4, 0, 0).page_rows(), page_rows_for(4));
  EXPECT_EQ(page_rows_for(14) * 14 * sizeof(float) * 2 > kTargetPageBytes, true);
  EXPECT_LE(page_rows_for(14) * 14 * sizeof(float), kTargetPageBytes);
  EXPECT_EQ(page_rows_for(1 << 22), 1u);
}

TEST_F(RowPoolTest, CommitTakesExactlyTheMarkedCandidates) {
  RowPool pool(card(), /*stride=*/0, /*initial_rows=*/64, /*page_rows=*/64);
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
  RowPool pool(card(), /*stride=*/3, /*initial_rows=*/0, /*page_rows=*/32);
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
  RowPool pool(card(), 2, 8, 8);
  allocate(card(), pool, 3);
  RowPool moved = std::move(pool);
  EXPECT_EQ(moved.in_use(), 3u);
  EXPECT_EQ(moved.capacity(), 8u);
  EXPECT_EQ(moved.stride(), 2);
}

}  // namespace
}  // namespace gpubox::card_table
