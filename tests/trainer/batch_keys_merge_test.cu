// merge_by_key (trainer/ps_modes/batch_keys.hpp), a PS thread's per-key merge of a batch's
// pushes, against the card's merge of the same pushes: SegmentReducer (HeterComm's local merge)
// on card 0 over the occurrences grouped by key in batch order, bit for bit, on either backend.
// One batch holds a key of more than 32*32 occurrences (chunks of ceil(sqrt(len))), keys of 33
// to 1024 (chunks of 32), keys of exactly 32 and 33, and cold ones; push records of 1, 11 and 17
// floats (one field group, and a second partial one). The left-to-right merge this replaced
// differs from the card's in the hot keys (checked, so the test fails on it). Also prints the
// merge's cost against that left-to-right merge (docs/bench/h132f.md).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <vector>

#include "heterps/device/card.hpp"
#include "heterps/device/memory.hpp"
#include "heterps/heter_comm/segment_reduce.cuh"
#include "trainer/ps_modes/batch_keys.hpp"

namespace gpubox::trainer::ps_modes {
namespace {

using heter_comm::position_t;

// `instances` instances of 2 slots: unless `hot` is 0, slot 0 holds key 1 `hot` times in all
// (spread over the instances) and keys 2..5 1090, 100, 33 and 32 times; every slot of every
// instance then one to three Zipf-like keys of a vocabulary of `vocab` (from key 10).
dataset::Batch make_batch(std::size_t instances, std::size_t hot, uint64_t vocab,
                          std::mt19937_64& rng) {
  std::vector<std::pair<uint64_t, std::size_t>> planted = {
      {1, hot}, {2, 1090}, {3, 100}, {4, 33}, {5, 32}};
  if (hot == 0) planted.clear();
  std::vector<std::vector<uint64_t>> slot0(instances);
  for (const auto& [key, count] : planted) {
    for (std::size_t c = 0; c < count; ++c) slot0[rng() % instances].push_back(key);
  }
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  dataset::Batch batch;
  batch.num_slots = 2;
  batch.labels.assign(instances, 0.0f);
  for (int s = 0; s < 2; ++s) {
    for (std::size_t i = 0; i < instances; ++i) {
      if (s == 0) batch.keys.insert(batch.keys.end(), slot0[i].begin(), slot0[i].end());
      for (int k = 1 + static_cast<int>(rng() % 3); k > 0; --k) {
        const double u = unit(rng);
        batch.keys.push_back(10 + static_cast<uint64_t>(static_cast<double>(vocab) * u * u));
      }
      batch.offsets.push_back(static_cast<uint32_t>(batch.keys.size()));
    }
  }
  return batch;
}

// Mixed signs and magnitudes: rounding differs visibly between summation orders.
std::vector<float> make_push(std::size_t floats, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-8, 8);
  std::vector<float> push(floats);
  for (float& v : push) v = std::ldexp(mantissa(rng), exponent(rng));
  return push;
}

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

// The merge merge_by_key replaced: every key's occurrences left to right from +0.
void left_to_right(const BatchKeys& keys, const float* push, int32_t push_dim, float* merged) {
  const auto dim = static_cast<std::size_t>(push_dim);
  std::fill(merged, merged + keys.size() * dim, 0.0f);
  const std::vector<uint32_t>& index = keys.occurrence_index();
  for (std::size_t j = 0; j < index.size(); ++j) {
    float* into = merged + std::size_t{index[j]} * dim;
    const float* from = push + j * dim;
    for (std::size_t f = 0; f < dim; ++f) into[f] += from[f];
  }
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
      SCOPED_TRACE(testing::Message() << "push_dim " << dim << ", hottest key " << hot);
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

// The merge's cost (gather + merge_by_key) against the left-to-right merge's (gather + that
// merge) over one batch, the median of 50 runs; printed, not asserted. A batch without hot keys,
// then one with (make_batch's planted keys).
TEST(MergeByKey, CostAgainstTheLeftToRightMerge) {
  const std::vector<int32_t> slot_ids = {3, 7};
  constexpr int32_t kDim = 11;
  std::mt19937_64 rng(7);
  for (const std::size_t hot : {std::size_t{0}, std::size_t{2000}}) {
    const dataset::Batch batch = make_batch(4096, hot, 12000, rng);
    const std::vector<float> push = make_push(batch.keys.size() * kDim, rng);
    BatchKeys keys;
    BufferGrowth growth;
    std::vector<float> merged(batch.keys.size() * kDim);
    double us[2];
    for (const bool chunked : {false, true}) {
      std::vector<double> runs;
      for (int r = 0; r < 50; ++r) {
        const auto begin = std::chrono::steady_clock::now();
        keys.gather(batch, slot_ids, growth);
        if (chunked) {
          merge_by_key(keys, push.data(), kDim, merged.data());
        } else {
          left_to_right(keys, push.data(), kDim, merged.data());
        }
        runs.push_back(
            std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - begin)
                .count());
      }
      std::nth_element(runs.begin(), runs.begin() + 25, runs.end());
      us[chunked] = runs[25];
    }
    std::printf(
        "gather + merge of %zu occurrences, %zu keys (%zu hot), push_dim %d: left to right "
        "%.0f us, in the card's order %.0f us\n",
        batch.keys.size(), keys.size(), keys.hot_keys().size(), kDim, us[0], us[1]);
  }
}

}  // namespace
}  // namespace gpubox::trainer::ps_modes
