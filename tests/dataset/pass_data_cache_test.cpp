// The pass data cache (dataset/pass_data_cache.hpp) against its oracle, a fresh parse of the same
// files by a data set without a cache: the same records in the same order (before and after a
// seeded shuffle), the same counts and messages, for file lists of 0, 1 and n lines and with
// malformed lines; the budget (only the loads that fit are kept, 0 keeps none); a file changed
// between loads read again (also with its old modification time put back); a file gone drops its
// list's entry; another parse config never served another's records; pipe_command, failed loads
// and strict parse failures never served. A served load borrows the cache's blocks (no copy),
// the cache's bytes counted once however many data sets borrow them; a pass that shuffles, stores
// its instances in its order or is released changes nothing the cache serves the next one. The
// unique keys kept with a load: pass_data_cache_keys_test.cpp.
#include "dataset/pass_data_cache.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <atomic>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "dataset/in_memory_dataset.hpp"
#include "tests/dataset/pass_data_cache_test_util.hpp"

namespace gpubox::dataset {
namespace {

using testing::config;
using testing::expect_same_load;
using testing::kDense;
using testing::kSlots;
using testing::load;
using testing::Loaded;
using testing::PassDataCacheTest;
using testing::PlainInstance;
using testing::records;
using testing::slot_lines;

TEST_F(PassDataCacheTest, ServedLoadsEqualAFreshParseBeforeAndAfterTheShuffle) {
  const std::vector<std::vector<std::string>> lists = {
      {empty_}, {one_}, {many_}, {bad_}, {empty_, one_, many_, bad_}, {many_, one_}};
  PassDataCache cache(std::size_t{64} << 20);
  std::uint64_t served = 0;
  for (const auto& files : lists) {
    const std::string what = "a list of " + std::to_string(files.size()) + " files, the first " +
                             files.front().substr(dir_.path().size());
    for (const std::uint64_t seed : {0, 17}) {
      const Loaded oracle = load(files, nullptr, seed);
      ASSERT_TRUE(oracle.status.ok()) << oracle.status.to_string();
      // The first load of the list reads it, every later one is served.
      const Loaded first = load(files, &cache, seed);
      expect_same_load(first, oracle, what + ", seed " + std::to_string(seed));
      EXPECT_EQ(first.stats.cached_files, seed == 0 ? 0u : files.size()) << what;
      for (int again = 0; again < 2; ++again) {
        const Loaded later = load(files, &cache, seed);
        expect_same_load(later, oracle, what + ", served, seed " + std::to_string(seed));
        EXPECT_EQ(later.stats.cached_files, files.size()) << what;
        EXPECT_EQ(later.stats.cached_instances, oracle.stats.instances) << what;
        served += oracle.stats.instances;
      }
    }
  }
  // {many_, one_} is another list than {one_} and {many_}: kept on its own.
  EXPECT_EQ(cache.counts().entries, lists.size());
  EXPECT_EQ(cache.counts().loads_served, 2 * 2 * lists.size() + lists.size());
  EXPECT_GT(served, 0u);
}

TEST_F(PassDataCacheTest, OnlyTheLoadsThatFitTheBudgetAreKept) {
  // Each list's bytes, as a cache that holds everything counts them.
  std::vector<std::size_t> bytes;
  for (const std::string& file : {one_, many_}) {
    PassDataCache all(std::size_t{64} << 20);
    load({file}, &all);
    bytes.push_back(all.counts().bytes);
  }
  ASSERT_GT(bytes[0], 0u);
  ASSERT_GT(bytes[1], bytes[0]);
  struct Case {
    std::size_t budget;
    bool one_kept, many_kept;
  };
  const std::vector<Case> cases = {{0, false, false},
                                   {bytes[0] - 1, false, false},
                                   {bytes[0], true, false},
                                   {bytes[0] + bytes[1] - 1, true, false},
                                   {bytes[0] + bytes[1], true, true}};
  for (const Case& c : cases) {
    SCOPED_TRACE("budget " + std::to_string(c.budget));
    PassDataCache cache(c.budget);
    const Loaded one_first = load({one_}, &cache);
    const Loaded many_first = load({many_}, &cache);
    // Said once, on the first load that does not fit (none when the budget is 0: off).
    const bool refused = c.budget > 0 && !(c.one_kept && c.many_kept);
    EXPECT_EQ(!one_first.stats.cache_note.empty() || !many_first.stats.cache_note.empty(), refused);
    if (!c.one_kept && c.budget > 0) {
      EXPECT_NE(one_first.stats.cache_note.find("runner.pass_cache_mb"), std::string::npos);
    }
    for (int epoch = 1; epoch < 3; ++epoch) {
      const Loaded one = load({one_}, &cache);
      const Loaded many = load({many_}, &cache);
      expect_same_load(one, one_first, "one");
      expect_same_load(many, many_first, "many");
      EXPECT_EQ(one.stats.cached_instances, c.one_kept ? 1u : 0u);
      EXPECT_EQ(many.stats.cached_instances, c.many_kept ? 257u : 0u);
      EXPECT_TRUE(one.stats.cache_note.empty() && many.stats.cache_note.empty());
    }
    EXPECT_EQ(cache.counts().entries, (c.one_kept ? 1u : 0u) + (c.many_kept ? 1u : 0u));
    EXPECT_LE(cache.counts().bytes, c.budget);
  }
}

TEST_F(PassDataCacheTest, AFileChangedBetweenLoadsIsReadAgain) {
  PassDataCache cache(std::size_t{64} << 20);
  const std::string file = dir_.write("changing", slot_lines(50, 4));
  const std::vector<std::string> files = {one_, file};
  load(files, &cache);
  ASSERT_EQ(load(files, &cache).stats.cached_files, 2u);
  // Another size.
  dir_.write("changing", slot_lines(60, 5));
  const Loaded resized = load(files, &cache);
  expect_same_load(resized, load(files, nullptr), "resized");
  EXPECT_EQ(resized.stats.cached_files, 0u);
  EXPECT_EQ(resized.stats.instances, 61u);
  expect_same_load(load(files, &cache), resized, "the resized file served");
  // The same size, other content, a later modification time (a rewrite within one tick of the
  // file clock keeps it: set it as a later write would).
  std::string same_size = slot_lines(60, 5);
  for (std::size_t at = same_size.find("click:"); at != std::string::npos;
       at = same_size.find("click:", at + 1)) {
    same_size[at + 6] = same_size[at + 6] == '0' ? '1' : '0';  // every label flipped
  }
  struct stat before {};
  ASSERT_EQ(::stat(file.c_str(), &before), 0);
  dir_.write("changing", same_size);
  const timespec times[2] = {before.st_atim, {before.st_mtim.tv_sec + 10, before.st_mtim.tv_nsec}};
  ASSERT_EQ(::utimensat(AT_FDCWD, file.c_str(), times, 0), 0);
  const Loaded rewritten = load(files, &cache);
  EXPECT_EQ(rewritten.stats.cached_files, 0u);
  expect_same_load(rewritten, load(files, nullptr), "rewritten");
  EXPECT_NE(rewritten.records, resized.records);
  EXPECT_EQ(cache.counts().entries, 1u);
  // The same size, other content, the old modification time put back (as touch -d or cp -p
  // do): the status-change time still moved.
  ASSERT_EQ(load(files, &cache).stats.cached_files, 2u);
  struct stat rewritten_stat {};
  ASSERT_EQ(::stat(file.c_str(), &rewritten_stat), 0);
  dir_.write("changing", slot_lines(60, 5));  // the labels flipped back, same size
  const timespec old_times[2] = {rewritten_stat.st_atim, rewritten_stat.st_mtim};
  ASSERT_EQ(::utimensat(AT_FDCWD, file.c_str(), old_times, 0), 0);
  const Loaded restored = load(files, &cache);
  EXPECT_EQ(restored.stats.cached_files, 0u);
  expect_same_load(restored, resized, "the first content back, under the old mtime");
  EXPECT_EQ(cache.counts().entries, 1u);
}

TEST_F(PassDataCacheTest, AFileGoneDropsItsListsEntriesAndTheirBytes) {
  PassDataCache cache(std::size_t{64} << 20);
  const std::string file = dir_.write("going", slot_lines(50, 6));
  const std::vector<std::string> files = {one_, file};
  load(files, &cache);
  load({many_}, &cache);
  const std::size_t many_bytes = [&] {
    PassDataCache alone(std::size_t{64} << 20);
    load({many_}, &alone);
    return alone.counts().bytes;
  }();
  ASSERT_EQ(cache.counts().entries, 2u);
  ASSERT_GT(cache.counts().bytes, many_bytes);
  // Gone: the load fails as it would without a cache, and the entry holds no budget.
  std::remove(file.c_str());
  const Loaded gone = load(files, &cache);
  EXPECT_FALSE(gone.status.ok());
  EXPECT_EQ(gone.status.to_string(), load(files, nullptr).status.to_string());
  EXPECT_EQ(cache.counts().entries, 1u);
  EXPECT_EQ(cache.counts().bytes, many_bytes);
  // Written again: read, kept again.
  dir_.write("going", slot_lines(50, 6));
  EXPECT_EQ(load(files, &cache).stats.cached_files, 0u);
  EXPECT_EQ(load(files, &cache).stats.cached_files, 2u);
  EXPECT_EQ(load({many_}, &cache).stats.cached_files, 1u);
}

TEST_F(PassDataCacheTest, AnotherParseConfigIsNotServedTheRecordsOfThisOne) {
  PassDataCache cache(std::size_t{64} << 20);
  // Each changes what the same files parse to (or what their load reports).
  DatasetConfig fewer_slots = testing::slot_config(kSlots - 1, kDense);
  fewer_slots.thread_num = 2;
  fewer_slots.split_bytes = 4096;
  DatasetConfig strict_unknown = config();
  strict_unknown.ignore_unknown_slots = false;
  DatasetConfig other_label = config();
  other_label.label_name = "show";  // not the files' label: every line fails
  DatasetConfig fewer_errors = config();
  fewer_errors.max_reported_errors = 1;
  DatasetConfig unsplit = config();
  unsplit.split_bytes = std::uint64_t{1} << 30;
  const std::vector<DatasetConfig> configs = {config(),    fewer_slots,  strict_unknown,
                                              other_label, fewer_errors, unsplit};
  for (std::size_t a = 0; a < configs.size(); ++a) {
    for (std::size_t b = 0; b < configs.size(); ++b) {
      EXPECT_EQ(parse_fingerprint(configs[a]) == parse_fingerprint(configs[b]), a == b) << a << b;
    }
  }
  const std::vector<std::string> files = {many_, bad_};
  for (int round = 0; round < 2; ++round) {
    for (std::size_t i = 0; i < configs.size(); ++i) {
      const Loaded oracle = load(files, nullptr, 0, configs[i]);
      const Loaded got = load(files, &cache, 0, configs[i]);
      EXPECT_EQ(got.status.ok(), oracle.status.ok()) << "config " << i;
      if (oracle.status.ok()) expect_same_load(got, oracle, "config " + std::to_string(i));
      EXPECT_EQ(got.stats.cached_files, round == 0 || !oracle.status.ok() ? 0u : files.size())
          << "config " << i << ", round " << round;
    }
  }
  // thread_num and batch_size do not change the records: the same entry.
  DatasetConfig more_threads = config();
  more_threads.thread_num = 3;
  more_threads.batch_size = 7;
  EXPECT_EQ(parse_fingerprint(more_threads), parse_fingerprint(config()));
  EXPECT_EQ(load(files, &cache, 0, more_threads).stats.cached_files, files.size());
}

TEST_F(PassDataCacheTest, PipeCommandsAndFailedLoadsAreNeverServed) {
  PassDataCache cache(std::size_t{64} << 20);
  DatasetConfig piped = config();
  piped.pipe_command = "cat";
  for (int epoch = 0; epoch < 2; ++epoch) {
    const Loaded got = load({many_}, &cache, 0, piped);
    ASSERT_TRUE(got.status.ok()) << got.status.to_string();
    EXPECT_EQ(got.stats.cached_files, 0u);
    EXPECT_EQ(got.stats.instances, 257u);
  }
  DatasetConfig strict = config();
  strict.strict_parse = true;
  for (int epoch = 0; epoch < 2; ++epoch) {
    const Loaded got = load({one_, bad_}, &cache, 0, strict);
    EXPECT_FALSE(got.status.ok());
    EXPECT_NE(got.status.message().find("strict_parse"), std::string::npos);
  }
  EXPECT_EQ(cache.counts().entries, 0u);
  EXPECT_EQ(cache.counts().loads_served, 0u);
}

// A run asked to stop stops its loads, whether the files or the cache would serve them: the
// evaluation after a stopped pass is not run from the cache (the Python API's raising callback).
TEST_F(PassDataCacheTest, AStopAskedBeforeTheLoadStopsALoadTheCacheWouldServe) {
  PassDataCache cache(std::size_t{64} << 20);
  ASSERT_TRUE(load({many_}, &cache).status.ok());
  ASSERT_EQ(cache.counts().entries, 1u);
  for (const bool cached : {true, false}) {
    SCOPED_TRACE(cached ? "cached" : "not cached");
    const std::atomic<bool> stop{true};
    InMemoryDataset ds(config());
    ds.set_filelist({many_});
    ds.set_pass_cache(cached ? &cache : nullptr);
    ds.set_stop_flag(&stop);
    const Status st = ds.load_into_memory();
    EXPECT_EQ(st.code(), Status::Code::kAborted) << st.to_string();
    EXPECT_EQ(ds.size(), 0u);
    EXPECT_EQ(ds.load_stats().cached_instances, 0u);
  }
  EXPECT_EQ(cache.counts().loads_served, 0u);
}

// What a load of 0, 1 and n blocks (split_bytes cuts the larger files into ranges) holds: the
// load that is kept and every load served share one copy of the records, the data sets' shared
// bytes are what the cache counts for them, and the cache's bytes do not grow with the loads.
TEST_F(PassDataCacheTest, ServedLoadsBorrowTheCachesBlocksCountedOnce) {
  const std::vector<std::vector<std::string>> lists = {{empty_}, {one_}, {many_}, {one_, many_}};
  for (const auto& files : lists) {
    SCOPED_TRACE("a list of " + std::to_string(files.size()) + " files, the first " +
                 files.front().substr(dir_.path().size()));
    PassDataCache cache(std::size_t{64} << 20);
    InMemoryDataset kept(config());
    kept.set_filelist(files);
    kept.set_pass_cache(&cache);
    ASSERT_TRUE(kept.load_into_memory().ok());
    ASSERT_EQ(cache.counts().entries, 1u);
    const std::size_t cache_bytes = cache.counts().bytes;
    // The blocks' bytes (the data set's own order index aside): all shared with the cache.
    const std::size_t order_bytes = kept.memory_bytes() - kept.shared_bytes();
    EXPECT_LE(order_bytes, kept.size() * 2 * sizeof(std::uint64_t) + 64);
    EXPECT_GT(cache_bytes, kept.shared_bytes());
    const Loaded oracle = load(files, nullptr);
    std::vector<std::unique_ptr<InMemoryDataset>> served;
    for (int epoch = 1; epoch <= 3; ++epoch) {
      served.push_back(std::make_unique<InMemoryDataset>(config()));
      InMemoryDataset& ds = *served.back();
      ds.set_filelist(files);
      ds.set_pass_cache(&cache);
      ASSERT_TRUE(ds.load_into_memory().ok());
      EXPECT_EQ(ds.load_stats().cached_files, files.size());
      EXPECT_EQ(records(ds), oracle.records);
      EXPECT_EQ(ds.shared_bytes(), kept.shared_bytes());
      // The same storage as the load that was kept: borrowed, not copied.
      ASSERT_EQ(ds.size(), kept.size());
      for (std::size_t i = 0; i < ds.size(); ++i) {
        ASSERT_EQ(ds.instance(i).keys, kept.instance(i).keys) << "instance " << i;
        ASSERT_EQ(ds.instance(i).dense, kept.instance(i).dense) << "instance " << i;
      }
      EXPECT_EQ(cache.counts().bytes, cache_bytes);
    }
    // Without a cache nothing is shared.
    InMemoryDataset alone(config());
    alone.set_filelist(files);
    ASSERT_TRUE(alone.load_into_memory().ok());
    EXPECT_EQ(alone.shared_bytes(), 0u);
  }
}

// A load the cache refuses (no room) shares nothing: its data set owns its blocks alone.
TEST_F(PassDataCacheTest, ALoadNotKeptSharesNothing) {
  PassDataCache cache(1);  // room for no entry
  InMemoryDataset ds(config());
  ds.set_filelist({many_});
  ds.set_pass_cache(&cache);
  ASSERT_TRUE(ds.load_into_memory().ok());
  EXPECT_FALSE(ds.load_stats().cache_note.empty());
  EXPECT_EQ(cache.counts().entries, 0u);
  EXPECT_EQ(ds.shared_bytes(), 0u);
}

// What one pass does to its instances (a seeded shuffle, storing them in that order, releasing
// them) never reaches what the cache serves the next pass, whose records are those of a fresh
// parse of the files; a data set's borrowed blocks outlive the cache.
TEST_F(PassDataCacheTest, WhatAPassDoesToItsInstancesDoesNotChangeWhatTheNextIsServed) {
  const std::vector<std::string> files = {one_, many_, bad_};
  const Loaded oracle = load(files, nullptr);
  auto cache = std::make_unique<PassDataCache>(std::size_t{64} << 20);
  std::vector<std::unique_ptr<InMemoryDataset>> passes;
  for (std::uint64_t pass = 0; pass < 4; ++pass) {
    SCOPED_TRACE("pass " + std::to_string(pass));
    passes.push_back(std::make_unique<InMemoryDataset>(config()));
    InMemoryDataset& ds = *passes.back();
    ds.set_filelist(files);
    ds.set_pass_cache(cache.get());
    ASSERT_TRUE(ds.load_into_memory().ok());
    EXPECT_EQ(ds.load_stats().cached_files, pass == 0 ? 0u : files.size());
    // As loaded: the files' records in their order (the shuffles of the passes before did not
    // reorder the blocks, their stores did not write into them).
    ASSERT_EQ(records(ds), oracle.records);
    EXPECT_EQ(ds.unique_keys(), oracle.unique_keys);
    EXPECT_GT(ds.shared_bytes(), 0u);
    ds.local_shuffle(pass + 1);
    const std::vector<PlainInstance> shuffled = records(ds);
    EXPECT_NE(shuffled, oracle.records);
    ASSERT_TRUE(ds.store_in_order());
    EXPECT_EQ(records(ds), shuffled);
    EXPECT_EQ(ds.shared_bytes(), 0u);  // its own blocks now
    if (pass % 2 == 1) ds.release_memory();
  }
  // The cache gone (set to none first, as set_pass_cache asks): the data sets keep the blocks
  // they borrowed (those not stored in order), and compute their unique keys without it.
  InMemoryDataset borrowed(config());
  borrowed.set_filelist(files);
  borrowed.set_pass_cache(cache.get());
  ASSERT_TRUE(borrowed.load_into_memory().ok());
  borrowed.set_pass_cache(nullptr);
  cache.reset();
  EXPECT_EQ(records(borrowed), oracle.records);
  EXPECT_EQ(borrowed.unique_keys_and_slots().keys, oracle.unique_keys);
  EXPECT_EQ(records(*passes[2]).size(), oracle.records.size());
}

}  // namespace
}  // namespace gpubox::dataset
