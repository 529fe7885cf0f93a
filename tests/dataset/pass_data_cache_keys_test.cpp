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
// (the load kept, which keeps them), counted in the budget and served with the load from then
// on, the data sets served using that one object: the same keys and slots as a data set without
// a cache computes, for lists of 0, 1 and n blocks.
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
    EXPECT_FALSE(kept.load_stats().cached_unique_keys) << what;
    const std::size_t load_bytes = cache.counts().bytes;
    const std::shared_ptr<const UniqueKeys> computed = kept.unique_keys_and_slots_shared();
    expect_same_keys(*computed, oracle, what + ", the load kept");
    const std::size_t keys_bytes = sizeof(UniqueKeys) + oracle.keys.size() * 12;
    EXPECT_EQ(cache.counts().bytes, load_bytes + keys_bytes) << what;
    EXPECT_EQ(cache.counts().unique_keys_bytes, keys_bytes) << what;
    // Kept by the data set that computed them: asked again, the same object, not computed again.
    EXPECT_EQ(kept.unique_keys_and_slots_shared(), computed) << what;
    expect_same_keys(kept.unique_keys_and_slots(), oracle, what + ", asked again");
    EXPECT_EQ(kept.unique_keys(), oracle.keys) << what;
    for (std::uint64_t served = 1; served <= 2; ++served) {
      InMemoryDataset ds(config());
      ds.set_filelist(files);
      ds.set_pass_cache(&cache);
      ASSERT_TRUE(ds.load_into_memory().ok());
      // It uses the cache's keys (those the load kept computed), not keys of its own.
      EXPECT_TRUE(ds.load_stats().cached_unique_keys) << what;
      EXPECT_EQ(ds.unique_keys_and_slots_shared(), computed) << what;
      expect_same_keys(ds.unique_keys_and_slots(), oracle, what + ", served");
      EXPECT_EQ(ds.unique_keys(), oracle.keys) << what;
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
  keys_of(other, &cache);  // its keys kept too
  // After another load the data set would drop them: not served, not counted as served.
  const std::uint64_t before_other = cache.counts().unique_keys_served;
  bool served_keys = true;
  expect_same_keys(keys_of(files, &cache, 0, other, &served_keys),
                   keys_of(files, nullptr, 0, other), "after another list");
  EXPECT_FALSE(served_keys);
  EXPECT_EQ(cache.counts().unique_keys_served, before_other + 1);  // `other`'s, not `files`'
  expect_same_keys(keys_of(other, &cache, 0, files), keys_of(other, nullptr, 0, files),
                   "before another list");
  // An empty load first leaves the data set holding just the second.
  keys_of({empty_}, &cache);
  expect_same_keys(keys_of(files, &cache, 0, {empty_}, &served_keys), in_load_order,
                   "after an empty list");
  EXPECT_TRUE(served_keys);
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

// Records first: the keys a cache keeps take the room of no load's records. With a budget of
// exactly two loads' records, both lists are kept whichever's keys were computed first (those
// keys dropped to make room, their load still served); with room for the keys too, both keep
// theirs. Every data set gets the keys a data set without a cache computes.
TEST_F(PassDataCacheTest, RememberedKeysGiveWayToALoadsRecords) {
  const std::vector<std::vector<std::string>> lists = {{one_}, {shared_keys_}};
  std::vector<std::size_t> record_bytes, keys_bytes;
  std::vector<UniqueKeys> oracles;
  for (const auto& files : lists) {
    PassDataCache all(std::size_t{64} << 20);
    keys_of(files, &all);
    record_bytes.push_back(all.counts().bytes - all.counts().unique_keys_bytes);
    keys_bytes.push_back(all.counts().unique_keys_bytes);
    ASSERT_GT(keys_bytes.back(), 0u);
    oracles.push_back(keys_of(files, nullptr));
  }
  // The first list's keys fit beside its records before the second list is read.
  ASSERT_LE(keys_bytes[0], record_bytes[1]);
  const std::size_t records_only = record_bytes[0] + record_bytes[1];
  for (const std::size_t budget : {records_only, records_only + keys_bytes[0] + keys_bytes[1]}) {
    const bool keys_fit = budget > records_only;
    SCOPED_TRACE(keys_fit ? "room for the keys too" : "room for the records alone");
    PassDataCache cache(budget);
    for (int epoch = 0; epoch < 3; ++epoch) {
      for (std::size_t l = 0; l < lists.size(); ++l) {
        bool served_keys = false;
        expect_same_keys(keys_of(lists[l], &cache, 0, {}, &served_keys), oracles[l],
                         "epoch " + std::to_string(epoch) + ", list " + std::to_string(l));
        EXPECT_EQ(served_keys, keys_fit && epoch > 0);
      }
      EXPECT_EQ(cache.counts().entries, 2u);
      EXPECT_EQ(cache.counts().unique_keys_bytes, keys_fit ? budget - records_only : 0u);
      EXPECT_LE(cache.counts().bytes, budget);
    }
    EXPECT_EQ(cache.counts().loads_served, 4u);
    EXPECT_EQ(cache.counts().unique_keys_served, keys_fit ? 4u : 0u);
  }
}

// A data set set to another cache (or none) keeps the keys it holds or computes, but never offers
// them to the cache it had (which may be gone by then).
TEST_F(PassDataCacheTest, KeysAreNeverOfferedToACacheNoLongerSet) {
  const std::vector<std::string> files = {shared_keys_};
  const UniqueKeys oracle = keys_of(files, nullptr);
  for (const bool to_another : {false, true}) {
    SCOPED_TRACE(to_another ? "another cache set" : "none set");
    PassDataCache cache(std::size_t{64} << 20);
    PassDataCache another(std::size_t{64} << 20);
    InMemoryDataset kept(config());
    kept.set_filelist(files);
    kept.set_pass_cache(&cache);
    ASSERT_TRUE(kept.load_into_memory().ok());
    const std::size_t bytes = cache.counts().bytes;
    kept.set_pass_cache(to_another ? &another : nullptr);
    const std::shared_ptr<const UniqueKeys> computed = kept.unique_keys_and_slots_shared();
    expect_same_keys(*computed, oracle, "detached");
    EXPECT_EQ(kept.unique_keys_and_slots_shared(), computed);  // kept all the same
    kept.set_pass_cache(&cache);  // set again: the load is still the one detached
    expect_same_keys(kept.unique_keys_and_slots(), oracle, "set again");
    EXPECT_EQ(cache.counts().bytes, bytes);
    EXPECT_EQ(cache.counts().unique_keys_bytes, 0u);
    EXPECT_EQ(another.counts().bytes, 0u);
    // Set to the same cache again before asking: offered as usual.
    InMemoryDataset served(config());
    served.set_filelist(files);
    served.set_pass_cache(&cache);
    ASSERT_TRUE(served.load_into_memory().ok());
    served.set_pass_cache(&cache);
    expect_same_keys(served.unique_keys_and_slots(), oracle, "served");
    EXPECT_GT(cache.counts().unique_keys_bytes, 0u);
  }
}

// Two threads: data sets served the list again and again while the load kept computes and offers
// its keys, and a second list's records then take their room; and two threads asking one data set
// for its keys at once. Every data set gets the records and keys of a data set without a cache,
// the two asking get one object.
TEST_F(PassDataCacheTest, KeysRememberedAndDroppedWhileLoadsAreServed) {
  const std::vector<std::string> files = {shared_keys_};
  const Loaded oracle = load(files, nullptr);
  const UniqueKeys oracle_keys = keys_of(files, nullptr);
  std::size_t budget = 0;
  {
    PassDataCache all(std::size_t{64} << 20);
    load(files, &all);
    load({many_}, &all);
    budget = all.counts().bytes;  // both lists' records, no keys
  }
  for (int round = 0; round < 8; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    PassDataCache cache(budget);
    InMemoryDataset kept(config());
    kept.set_filelist(files);
    kept.set_pass_cache(&cache);
    ASSERT_TRUE(kept.load_into_memory().ok());
    std::atomic<bool> go{false};
    std::thread reader([&] {
      while (!go.load()) std::this_thread::yield();
      for (int i = 0; i < 20; ++i) {
        InMemoryDataset ds(config());
        ds.set_filelist(files);
        ds.set_pass_cache(&cache);
        ASSERT_TRUE(ds.load_into_memory().ok());
        ASSERT_EQ(records(ds), oracle.records);
        expect_same_keys(ds.unique_keys_and_slots(), oracle_keys, "served");
      }
    });
    std::shared_ptr<const UniqueKeys> asked[2];
    std::thread asker([&] {
      while (!go.load()) std::this_thread::yield();
      asked[1] = kept.unique_keys_and_slots_shared();
    });
    go.store(true);
    asked[0] = kept.unique_keys_and_slots_shared();
    const Loaded second = load({many_}, &cache);  // takes the room of any keys kept
    asker.join();
    reader.join();
    ASSERT_TRUE(second.status.ok());
    EXPECT_EQ(asked[0], asked[1]);
    expect_same_keys(*asked[0], oracle_keys, "the load kept");
    EXPECT_EQ(cache.counts().entries, 2u);
    EXPECT_EQ(cache.counts().unique_keys_bytes, 0u);
    EXPECT_EQ(cache.counts().bytes, budget);
  }
}

}  // namespace
}  // namespace gpubox::dataset
