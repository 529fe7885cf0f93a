// InMemoryDataset::store_in_order: a shuffled pass's instances copied into their shuffled order
// keep every instance, batch and key, take no more memory than the load, and a stop keeps them.
#include <gtest/gtest.h>

#include <atomic>
#include <cstddef>
#include <string>
#include <vector>

#include "dataset/in_memory_dataset.hpp"
#include "tests/dataset/in_memory_dataset_test_util.hpp"
#include "tests/dataset/test_util.hpp"

namespace gpubox::dataset {
namespace {

using namespace text_sets;  // NOLINT: the shared text sets and their helpers

TEST(InMemoryDataset, StoredInOrderEveryInstanceAndBatchStaysTheSame) {
  ScratchDir dir;
  const auto files = indexed_files(dir, 140000);
  for (const int threads : {1, 3}) {
    SCOPED_TRACE(threads);
    DatasetConfig c = config(threads);
    c.batch_size = 1000;
    InMemoryDataset ds(c);
    ds.set_filelist(files);
    ASSERT_TRUE(ds.load_into_memory().ok());
    ds.local_shuffle(9);
    const std::vector<PlainInstance> shuffled = contents(ds);
    const std::vector<std::uint64_t> keys = ds.unique_keys();
    std::vector<Batch> batches;
    for (int card = 0; card < 3; ++card) {
      for (std::size_t b = 0; b < ds.num_batches_per_card(3); ++b) {
        ds.fill_batch(card, 3, b, &batches.emplace_back());
      }
    }
    for (int round = 0; round < 2; ++round) {
      ASSERT_TRUE(ds.store_in_order());
      ASSERT_EQ(contents(ds), shuffled);
      EXPECT_EQ(ds.unique_keys(), keys);
      std::size_t at = 0;
      Batch batch;
      for (int card = 0; card < 3; ++card) {
        for (std::size_t b = 0; b < ds.num_batches_per_card(3); ++b, ++at) {
          ds.fill_batch(card, 3, b, &batch);
          ASSERT_EQ(batch.keys, batches[at].keys) << card << " " << b;
          ASSERT_EQ(batch.offsets, batches[at].offsets);
          ASSERT_EQ(batch.dense, batches[at].dense);
          ASSERT_EQ(batch.labels, batches[at].labels);
        }
      }
    }
  }
  InMemoryDataset empty(config());
  EXPECT_TRUE(empty.store_in_order());
  EXPECT_EQ(empty.size(), 0u);
}

// A stored block holds 65,536 instances: 1, exactly one block, and one more than a block keep
// every instance and take no more memory than the load (each stored array sized exactly).
TEST(InMemoryDataset, StoredInOrderAtABlocksEdges) {
  ScratchDir dir;
  for (const std::size_t n : {std::size_t{1}, std::size_t{1} << 16, (std::size_t{1} << 16) + 1}) {
    SCOPED_TRACE(n);
    InMemoryDataset ds(config(2));
    ds.set_filelist(indexed_files(dir, n));
    ASSERT_TRUE(ds.load_into_memory().ok());
    ASSERT_EQ(ds.size(), n);
    const std::size_t before = ds.memory_bytes();
    ds.local_shuffle(4);
    const std::vector<PlainInstance> shuffled = contents(ds);
    ASSERT_TRUE(ds.store_in_order());
    EXPECT_EQ(contents(ds), shuffled);
    EXPECT_LE(ds.memory_bytes(), before + before / 10);
  }
}

// visit_key_runs hands over the keys of a range of positions, in order, as the instances hold
// them (the oracle: instance(p)'s keys one after another), in one run a stretch of positions
// stored one after another: a range inside one loaded file, or stored in order, is one run;
// after a shuffle alone, nearly a run a position. Empty ranges at either end hand over nothing.
TEST(InMemoryDataset, KeyRunsAreTheInstancesKeysInOrder) {
  ScratchDir dir;
  const TextSet text = make_text(dir, 3, 700, 0.0, 21);
  InMemoryDataset ds(config(2));
  ds.set_filelist(text.files);
  ASSERT_TRUE(ds.load_into_memory().ok());
  const std::size_t n = ds.size();
  ASSERT_GT(n, 1000u);
  auto expect_runs = [&ds](std::size_t begin, std::size_t end) {
    std::vector<std::uint64_t> want;
    for (std::size_t p = begin; p < end; ++p) {
      const InstanceRef ref = ds.instance(p);
      want.insert(want.end(), ref.keys, ref.keys + ref.num_keys());
    }
    std::vector<std::uint64_t> got;
    std::size_t runs = 0;
    ds.visit_key_runs(begin, end, [&](const std::uint64_t* keys, std::size_t count) {
      got.insert(got.end(), keys, keys + count);
      ++runs;
    });
    EXPECT_EQ(got, want) << "[" << begin << ", " << end << ")";
    return runs;
  };
  const std::size_t first_file = text.instances.size() / 3;  // roughly: inside the first file
  EXPECT_EQ(expect_runs(0, 0), 0u);
  EXPECT_EQ(expect_runs(n, n), 0u);
  EXPECT_EQ(expect_runs(0, 1), 1u);
  EXPECT_EQ(expect_runs(3, first_file / 2), 1u);
  expect_runs(0, n);
  ds.local_shuffle(8);
  EXPECT_GT(expect_runs(0, n), n / 2);
  expect_runs(n - 1, n);
  ASSERT_TRUE(ds.store_in_order());
  EXPECT_EQ(expect_runs(0, n), 1u);
  EXPECT_EQ(expect_runs(5, n - 5), 1u);
}

// Each stored block reserves exactly its keys. A reserve by the pass's mean (rounded up) left
// the blocks with fewer keys a line a third empty and doubled those with more: here the first
// 70,000 lines hold 12 keys, the rest 1 (the mean 6.5), stored as loaded and after a shuffle,
// and random lines of 0 to 12 keys.
TEST(InMemoryDataset, StoredInOrderTakesNoMoreMemoryThanTheLoad) {
  ScratchDir dir;
  std::string skewed;
  for (int i = 0; i < 140000; ++i) {
    skewed += "click:1 dense_feature:1 dense_feature:2";
    for (int s = 1; s <= (i < 70000 ? kSlots : 1); ++s) {
      for (int k = 0; k < (i < 70000 ? 3 : 1); ++k) skewed += " " + std::to_string(s) + ":9";
    }
    skewed += "\n";
  }
  const std::vector<std::vector<std::string>> passes = {{dir.write("skewed", skewed)},
                                                        make_text(dir, 2, 80000, 0.0, 13).files};
  for (const int threads : {1, 3}) {
    for (const auto& files : passes) {
      for (const bool shuffle : {false, true}) {
        SCOPED_TRACE(std::to_string(threads) + " threads, shuffled " + std::to_string(shuffle));
        InMemoryDataset ds(config(threads));
        ds.set_filelist(files);
        ASSERT_TRUE(ds.load_into_memory().ok());
        ASSERT_GT(ds.size(), std::size_t{2} << 16);  // more than two stored blocks
        const std::size_t before = ds.memory_bytes();
        if (shuffle) ds.local_shuffle(3);
        ASSERT_TRUE(ds.store_in_order());
        EXPECT_LE(ds.memory_bytes(), before + before / 10);
      }
    }
  }
}

// A set stop flag ends store_in_order with false and the storage as it was.
TEST(InMemoryDataset, AStopFlagEndsStoredInOrderAndKeepsTheInstances) {
  ScratchDir dir;
  const TextSet text = make_text(dir, 1, 3000, 0.0, 17);
  std::atomic<bool> stop{false};
  InMemoryDataset ds(config(2));
  ds.set_filelist(text.files);
  ds.set_stop_flag(&stop);
  ASSERT_TRUE(ds.load_into_memory().ok());
  ds.local_shuffle(5);
  const std::vector<PlainInstance> shuffled = contents(ds);
  const std::size_t bytes = ds.memory_bytes();
  stop = true;
  EXPECT_FALSE(ds.store_in_order());
  EXPECT_EQ(contents(ds), shuffled);
  EXPECT_EQ(ds.memory_bytes(), bytes);
  stop = false;
  EXPECT_TRUE(ds.store_in_order());
  EXPECT_EQ(contents(ds), shuffled);
}

}  // namespace
}  // namespace gpubox::dataset
