// Helpers of the pass data cache tests (pass_data_cache_test.cpp, pass_data_cache_keys_test.cpp):
// seeded files, the loads they compare and the fixture holding their files.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "dataset/in_memory_dataset.hpp"
#include "dataset/pass_data_cache.hpp"
#include "tests/dataset/test_util.hpp"

namespace gpubox::dataset::testing {

inline constexpr int kSlots = 3;
inline constexpr int kDense = 2;

// `lines` seeded slot-format lines; every `bad_every`-th (when > 0) has a key that is no number.
inline std::string slot_lines(int lines, unsigned seed, int bad_every = 0) {
  std::mt19937_64 rng(seed);
  std::string text;
  for (int i = 0; i < lines; ++i) {
    text += "click:" + std::to_string(rng() % 2);
    text += " dense_feature:" + std::to_string(static_cast<double>(rng() % 1000) / 100.0);
    text += " dense_feature:" + std::to_string(static_cast<double>(rng() % 1000) / 100.0);
    for (int s = 1; s <= kSlots; ++s) {
      const int keys = static_cast<int>(rng() % 3);  // 0 to 2 keys a slot
      for (int k = 0; k < keys; ++k) text += " " + std::to_string(s) + ":" + std::to_string(rng());
    }
    if (bad_every > 0 && i % bad_every == bad_every - 1) text += " 2:not_a_key";
    text += "\n";
  }
  return text;
}

// `lines` seeded slot-format lines whose keys come from 1..`vocab` in every slot: a key's first
// slot depends on the order of the instances.
inline std::string shared_key_lines(int lines, unsigned seed, unsigned vocab) {
  std::mt19937_64 rng(seed);
  std::string text;
  for (int i = 0; i < lines; ++i) {
    text += "click:" + std::to_string(rng() % 2) + " dense_feature:1 dense_feature:2";
    for (int s = 1; s <= kSlots; ++s)
      text += " " + std::to_string(s) + ":" + std::to_string(1 + rng() % vocab);
    text += "\n";
  }
  return text;
}

inline DatasetConfig config() {
  DatasetConfig c = slot_config(kSlots, kDense);
  c.thread_num = 2;
  c.split_bytes = 4096;  // the larger files are read as several ranges
  return c;
}

inline std::vector<PlainInstance> records(const InMemoryDataset& ds) {
  std::vector<PlainInstance> out;
  for (std::size_t i = 0; i < ds.size(); ++i) out.push_back(to_plain(ds.instance(i)));
  return out;
}

// A load of `files` with `cache` (nullptr: none), shuffled with `seed` when it is not 0.
struct Loaded {
  Status status;
  std::vector<PlainInstance> records;
  std::vector<std::uint64_t> unique_keys;
  LoadStats stats;
};
inline Loaded load(const std::vector<std::string>& files, PassDataCache* cache,
                   std::uint64_t seed = 0, const DatasetConfig& c = config()) {
  InMemoryDataset ds(c);
  ds.set_filelist(files);
  ds.set_pass_cache(cache);
  Loaded out;
  out.status = ds.load_into_memory();
  if (seed != 0) ds.local_shuffle(seed);
  out.records = records(ds);
  out.unique_keys = ds.unique_keys();
  out.stats = ds.load_stats();
  return out;
}

inline void expect_same_load(const Loaded& got, const Loaded& want, const std::string& what) {
  ASSERT_TRUE(got.status.ok()) << what << ": " << got.status.to_string();
  EXPECT_EQ(got.records, want.records) << what;
  EXPECT_EQ(got.unique_keys, want.unique_keys) << what;
  EXPECT_EQ(got.stats.files, want.stats.files) << what;
  EXPECT_EQ(got.stats.lines, want.stats.lines) << what;
  EXPECT_EQ(got.stats.instances, want.stats.instances) << what;
  EXPECT_EQ(got.stats.positives, want.stats.positives) << what;
  EXPECT_EQ(got.stats.skipped_lines(), want.stats.skipped_lines()) << what;
  ASSERT_EQ(got.stats.errors.size(), want.stats.errors.size()) << what;
  for (std::size_t e = 0; e < want.stats.errors.size(); ++e) {
    EXPECT_EQ(got.stats.errors[e].to_string(), want.stats.errors[e].to_string()) << what;
  }
}

class PassDataCacheTest : public ::testing::Test {
 protected:
  ScratchDir dir_;
  const std::string empty_ = dir_.write("empty", "");
  const std::string one_ = dir_.write("one", slot_lines(1, 1));
  const std::string many_ = dir_.write("many", slot_lines(257, 2));
  const std::string bad_ = dir_.write("bad", slot_lines(100, 3, /*bad_every=*/7));
  const std::string shared_keys_ = dir_.write("shared_keys", shared_key_lines(300, 4, 40));
};

// unique_keys_and_slots of a data set loading `files` (after `other` when not empty) with
// `cache`, shuffled with `seed` and stored in that order when it is not 0; `*served_keys` (when
// given): the load of `files` was served its unique keys (LoadStats::cached_unique_keys).
inline UniqueKeys keys_of(const std::vector<std::string>& files, PassDataCache* cache,
                          std::uint64_t seed = 0, const std::vector<std::string>& other = {},
                          bool* served_keys = nullptr) {
  InMemoryDataset ds(config());
  ds.set_pass_cache(cache);
  if (!other.empty()) {
    ds.set_filelist(other);
    EXPECT_TRUE(ds.load_into_memory().ok());
  }
  ds.set_filelist(files);
  EXPECT_TRUE(ds.load_into_memory().ok());
  if (served_keys != nullptr) *served_keys = ds.load_stats().cached_unique_keys;
  if (seed != 0) {
    ds.local_shuffle(seed);
    EXPECT_TRUE(ds.store_in_order());
  }
  UniqueKeys out = ds.unique_keys_and_slots();
  EXPECT_EQ(ds.unique_keys(), out.keys);
  return out;
}

inline void expect_same_keys(const UniqueKeys& got, const UniqueKeys& want,
                             const std::string& what) {
  EXPECT_EQ(got.keys, want.keys) << what;
  EXPECT_EQ(got.slots, want.slots) << what;
}

}  // namespace gpubox::dataset::testing
