// BatchKeys against a std::map oracle: a batch's distinct keys in order of first occurrence
// (slot-major, as batch.keys lies), the slot each was first seen in, each occurrence's key, and
// the occurrences grouped by key in batch order (the segments a PS thread merges its pushes over
// in a card's order, PsWorker::merge_push). Seeded batches of 0, 1, 2 and 64 instances with keys
// repeated within and across slots, gathered one after another into the same BatchKeys (its
// buffers reused: nothing of a larger batch may leak into a smaller one).
#include "trainer/ps_modes/batch_keys.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <random>
#include <vector>

namespace gpubox::trainer::ps_modes {
namespace {

// `instances` instances of `slots` slots, 0 to 3 keys a slot from a Zipf-like draw over 40 keys
// (key 0 never: the parsers drop it).
dataset::Batch make_batch(std::size_t instances, int slots, std::mt19937_64& rng) {
  dataset::Batch batch;
  batch.num_slots = slots;
  batch.labels.assign(instances, 0.0f);
  std::uniform_int_distribution<int> per_slot(0, 3);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  for (int s = 0; s < slots; ++s) {
    for (std::size_t i = 0; i < instances; ++i) {
      for (int k = per_slot(rng); k > 0; --k) {
        const double u = unit(rng);
        batch.keys.push_back(1 + static_cast<uint64_t>(40.0 * u * u * u));
      }
      batch.offsets.push_back(static_cast<uint32_t>(batch.keys.size()));
    }
  }
  return batch;
}

void expect_gathered(const BatchKeys& got, const dataset::Batch& batch,
                     const std::vector<int32_t>& slot_ids) {
  // The oracle: each key's occurrences in batch order, its first slot, the first-seen order.
  std::map<uint64_t, std::vector<uint32_t>> occurrences;
  std::map<uint64_t, int32_t> first_slot;
  std::vector<uint64_t> first_seen;
  const std::size_t b = batch.size();
  for (int s = 0; s < batch.num_slots; ++s) {
    for (uint32_t j = batch.offsets[static_cast<std::size_t>(s) * b];
         j < batch.offsets[static_cast<std::size_t>(s + 1) * b]; ++j) {
      const uint64_t key = batch.keys[j];
      if (occurrences.count(key) == 0) {
        first_seen.push_back(key);
        first_slot[key] = slot_ids[static_cast<std::size_t>(s)];
      }
      occurrences[key].push_back(j);
    }
  }
  ASSERT_EQ(got.keys(), first_seen);
  ASSERT_EQ(got.slots().size(), first_seen.size());
  ASSERT_EQ(got.occurrence_index().size(), batch.keys.size());
  ASSERT_EQ(got.key_start().size(), first_seen.size() + 1);
  ASSERT_EQ(got.by_key().size(), batch.keys.size());
  EXPECT_EQ(got.key_start().front(), 0u);
  EXPECT_EQ(got.key_start().back(), batch.keys.size());
  for (std::size_t u = 0; u < first_seen.size(); ++u) {
    const uint64_t key = first_seen[u];
    EXPECT_EQ(got.slots()[u], first_slot[key]) << "key " << key;
    const std::vector<uint32_t> grouped(got.by_key().begin() + got.key_start()[u],
                                        got.by_key().begin() + got.key_start()[u + 1]);
    EXPECT_EQ(grouped, occurrences[key]) << "key " << key;
    for (const uint32_t j : occurrences[key]) EXPECT_EQ(got.occurrence_index()[j], u);
  }
}

TEST(BatchKeys, KeysSlotsAndOccurrencesGroupedByKeyAgainstAMap) {
  std::mt19937_64 rng(32);
  const std::vector<int32_t> slot_ids = {7, 3, 11};
  BatchKeys keys;
  BufferGrowth growth;
  for (const std::size_t instances : {64u, 0u, 1u, 2u, 64u, 1u}) {
    SCOPED_TRACE(instances);
    const dataset::Batch batch = make_batch(instances, 3, rng);
    keys.gather(batch, slot_ids, growth);
    expect_gathered(keys, batch, slot_ids);
  }
}

}  // namespace
}  // namespace gpubox::trainer::ps_modes
