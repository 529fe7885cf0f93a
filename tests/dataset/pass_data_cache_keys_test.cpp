// The unique keys the pass data cache keeps with a load (dataset/pass_data_cache.hpp): computed
// once by a data set holding just that load, served with it from then on, exactly those of a data
// set without a cache; counted in the budget but never at the cost of a load's records; never
// served to a data set holding anything else (another load besides, its instances stored in
// another order), nor offered to a cache the data set no longer has.
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "dataset/in_memory_dataset.hpp"
#include "dataset/pass_data_cache.hpp"
#include "tests/dataset/pass_data_cache_test_util.hpp"

namespace gpubox::dataset {
namespace {

using testing::config;
using testing::expect_same_keys;
using testing::keys_of;
using testing::load;
using testing::Loaded;
using testing::PassDataCacheTest;
using testing::records;
using testing::shared_key_lines;

// The unique keys of a load the cache keeps are computed once, by the first data set that asks
// (the load kept), counted in the budget and served with the load from then on: the same keys
// and slots as a data set without a cache computes, for lists of 0, 1 and n blocks.
TEST_F(PassDataCacheTest, AKeptLoadsUniqueKeysAreComputedOnceThenServed) {
  const std::vector<std::vector<std::string>> lists = {
      {empty_}, {one_}, {many_}, {shared_keys_}, {one_, shared_keys_, many_}};
  for (const auto& files : lists) {
    const std::string what = "a list of " + std::to_string(files.size()) + " files, the first " +
                             files.front().substr(dir_.path().size());
    const UniqueKeys oracle = keys_of(files, nullptr);
    PassDataCache cache(std::size_t{64} << 20);
    InMemoryDataset kept(config());
    kept.set_filelist(files);
    kept.set_pass_cache(&cache);
    ASSERT_TRUE(kept.load_into_memory().ok());
    const std::size_t load_bytes = cache.counts().bytes;
    expect_same_keys(kept.unique_keys_and_slots(), oracle, what + ", the load kept");
    const std::size_t keys_bytes = sizeof(UniqueKeys) + oracle.keys.size() * 12;
    EXPECT_EQ(cache.counts().bytes, load_bytes + keys_bytes) << what;
    expect_same_keys(kept.unique_keys_and_slots(), oracle, what + ", asked again");
    for (std::uint64_t served = 1; served <= 2; ++served) {
      expect_same_keys(keys_of(files, &cache), oracle, what + ", served");
      EXPECT_EQ(cache.counts().unique_keys_served, served) << what;
    }
    EXPECT_EQ(cache.counts().bytes, load_bytes + keys_bytes) << what;
  }
}

// Keys the cache remembers are a load's in load order: a data set holding more than that load, or
// its instances stored in another order (a key's first slot then changes), computes its own, as
// one without a cache does; a file changed between epochs is read, kept and its keys computed
// again.
TEST_F(PassDataCacheTest, UniqueKeysOfAnythingButOneServedLoadAreComputed) {
  PassDataCache cache(std::size_t{64} << 20);
  const std::vector<std::string> files = {shared_keys_};
  const UniqueKeys in_load_order = keys_of(files, &cache);
  ASSERT_EQ(keys_of(files, &cache).slots, in_load_order.slots);
  ASSERT_EQ(cache.counts().unique_keys_served, 1u);
  // Stored in a shuffled order: the first occurrences move (the test could not fail otherwise).
  const UniqueKeys stored = keys_of(files, nullptr, /*seed=*/5);
  ASSERT_NE(stored.slots, in_load_order.slots);
  expect_same_keys(keys_of(files, &cache, 5), stored, "stored in a shuffled order");
  // After another load, and with another load after it.
  const std::vector<std::string> other = {many_, one_};
  keys_of(other, &cache);
  expect_same_keys(keys_of(files, &cache, 0, other), keys_of(files, nullptr, 0, other),
                   "after another list");
  expect_same_keys(keys_of(other, &cache, 0, files), keys_of(other, nullptr, 0, files),
                   "before another list");
  // An empty load first leaves the data set holding just the second.
  keys_of({empty_}, &cache);
  expect_same_keys(keys_of(files, &cache, 0, {empty_}), in_load_order, "after an empty list");
  // The file rewritten (another size): read again, the old keys not served.
  const std::uint64_t served = cache.counts().unique_keys_served;
  dir_.write("shared_keys", shared_key_lines(301, 6, 40));
  const UniqueKeys rewritten = keys_of(files, nullptr);
  ASSERT_FALSE(rewritten.keys == in_load_order.keys && rewritten.slots == in_load_order.slots);
  expect_same_keys(keys_of(files, &cache), rewritten, "rewritten, read again");
  expect_same_keys(keys_of(files, &cache), rewritten, "rewritten, served");
  EXPECT_EQ(cache.counts().unique_keys_served, served + 1);
}

// Keys that do not fit in what the budget has left are not kept; the data sets served compute
// them, the same.
TEST_F(PassDataCacheTest, UniqueKeysThatDoNotFitAreNotKept) {
  const std::vector<std::string> files = {many_};
  std::size_t load_bytes = 0;
  {
    PassDataCache all(std::size_t{64} << 20);
    InMemoryDataset ds(config());
    ds.set_filelist(files);
    ds.set_pass_cache(&all);
    ASSERT_TRUE(ds.load_into_memory().ok());
    load_bytes = all.counts().bytes;
  }
  PassDataCache cache(load_bytes);
  const UniqueKeys oracle = keys_of(files, nullptr);
  for (int epoch = 0; epoch < 3; ++epoch) {
    expect_same_keys(keys_of(files, &cache), oracle, "epoch " + std::to_string(epoch));
  }
  EXPECT_EQ(cache.counts().entries, 1u);
  EXPECT_EQ(cache.counts().bytes, load_bytes);
  EXPECT_EQ(cache.counts().loads_served, 2u);
  EXPECT_EQ(cache.counts().unique_keys_served, 0u);
}

}  // namespace
}  // namespace gpubox::dataset
