// merge_by_key (trainer/ps_modes/batch_keys.hpp), a PS thread's per-key merge of a batch's
// pushes, against the card's merge of the same pushes: SegmentReducer (HeterComm's local merge)
// on card 0 over the occurrences grouped by key in batch order, bit for bit, on either backend.
// One batch holds a key of more than 32*32 occurrences (chunks of ceil(sqrt(len))), keys of 33
// to 1024 (chunks of 32), keys of exactly 32 and 33, and cold ones; push records of 1, 11 and 17
// floats (one field group, and a second partial one). The left-to-right merge this replaced
// differs from the card's in the hot keys (checked, so the test fails on it). Its cost against
// that merge: gpubox_bench ps-merge.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <random>
#include <vector>

#include "heterps/device/card.hpp"
#include "heterps/device/memory.hpp"
#include "heterps/heter_comm/segment_reduce.cuh"
#include "tests/trainer/ps_merge_batches.hpp"
#include "trainer/ps_modes/batch_keys.hpp"

namespace gpubox::trainer::ps_modes {
namespace {

using heter_comm::position_t;
using testing::left_to_right;
using testing::make_batch;
using testing::make_push;

// The card's merge: each key's occurrences grouped in batch order (a std::map oracle, not
// BatchKeys), keys in order of first occurrence, summed by SegmentReducer on card 0.
std::vector<float> card_merge(const dataset::Batch& batch, const std::vector<float>& push,
                              int32_t dim) {
  std::map<uint64_t, std::vector<position_t>> occurrences;
  std::vector<uint64_t> first_seen;
  for (std::size_t j = 0; j < batch.keys.size(); ++j) {
    auto& list = occurrences[batch.keys[j]];
    if (list.empty()) first_seen.push_back(batch.keys[j]);
    list.push_back(static_cast<position_t>(j));
  }
  std::vector<position_t> start = {0};
  std::vector<position_t> order;
  for (const uint64_t key : first_seen) {
    order.insert(order.end(), occurrences[key].begin(), occurrences[key].end());
    start.push_back(static_cast<position_t>(order.size()));
  }
  device::CardSet cards = device::CardSet::from_list("0", 0, 1, 1);
  device::Card& card = cards.card(0);
  card.activate();
  const auto& stream = card.stream();
  auto d_start = device::to_device(start, card.memory(), stream);
  auto d_order = device::to_device(order, card.memory(), stream);
  auto d_push = device::to_device(push, card.memory(), stream);
  auto d_out = card.make_buffer<float>(first_seen.size() * static_cast<std::size_t>(dim));
  heter_comm::SegmentReducer<float>(card).run(
      d_start.data(), first_seen.size(), order.size(), dim,
      heter_comm::OrderedRecords<float>{d_push.data(), d_order.data(), dim},
      heter_comm::RecordRows<float>{d_out.data(), nullptr, dim}, stream);
  return device::to_host(d_out);
}

// Records of `dim` floats whose bits differ between a and b.
std::size_t records_differing(const std::vector<float>& a, const std::vector<float>& b,
                              int32_t dim) {
  std::size_t differing = 0;
  for (std::size_t r = 0; r < a.size() / static_cast<std::size_t>(dim); ++r) {
    const std::size_t at = r * static_cast<std::size_t>(dim);
    differing += std::memcmp(a.data() + at, b.data() + at, sizeof(float) * dim) != 0;
  }
  return differing;
}

TEST(MergeByKey, IsTheCardsMergeBitForBit) {
  const std::vector<int32_t> slot_ids = {3, 7};
  BatchKeys keys;
  BufferGrowth growth;
  std::mt19937_64 rng(132);
  for (const int32_t dim : {1, 11, 17}) {
    for (const std::size_t hot : {std::size_t{1025}, std::size_t{5000}}) {
      SCOPED_TRACE(::testing::Message() << "push_dim " << dim << ", hottest key " << hot);
      const dataset::Batch batch = make_batch(256, hot, 3000, rng);
      keys.gather(batch, slot_ids, growth);
      ASSERT_EQ(keys.hot_keys().size(), 4u);  // keys 1 to 4; key 5's 32 are left to right
      const std::vector<float> push =
          make_push(batch.keys.size() * static_cast<std::size_t>(dim), rng);
      std::vector<float> merged(keys.size() * static_cast<std::size_t>(dim));
      merge_by_key(keys, push.data(), dim, merged.data());
      const std::vector<float> card = card_merge(batch, push, dim);
      ASSERT_EQ(card.size(), merged.size());
      EXPECT_EQ(records_differing(merged, card, dim), 0u);
      // The left-to-right merge gives the card's bits for the cold keys only.
      std::vector<float> old(merged.size());
      left_to_right(keys, push.data(), dim, old.data());
      EXPECT_GE(records_differing(old, card, dim), 1u);
      EXPECT_LE(records_differing(old, card, dim), keys.hot_keys().size());
    }
  }
}

}  // namespace
}  // namespace gpubox::trainer::ps_modes
