// SlotSumPool at widths past one work item's column group (heter_comm::kDefaultFieldsPerItem on
// the cpu backend): wide records, slots narrower than them (0, one under, at and over a group),
// cvm on and off, dense features wider than a group, fp32 and bf16 rows. Forward against a
// float64 oracle, the bf16 rows as the fp32 ones rounded, backward's push records exactly.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "heterps/device/card.hpp"
#include "heterps/device/parallel_for.cuh"
#include "heterps/heter_comm/segment_reduce.cuh"
#include "tests/trainer/one_card.hpp"
#include "tests/trainer/slot_batch.hpp"
#include "tests/trainer/test_util.hpp"
#include "trainer/nn/bf16.hpp"
#include "trainer/nn/layers.hpp"

namespace gpubox::trainer {
namespace {

using testing::random_vector;

constexpr int kGroup = heter_comm::kFieldGroup;

// Output column o of slot s (width columns from `begin`) as float64: cvm's two counters, then
// field o (cvm) or 2 + o (no cvm) summed over the segment.
double pooled_oracle(const HostSlotBatch& h, int segment, int o, bool use_cvm) {
  std::vector<double> sum(h.pull_dim, 0.0);
  for (uint32_t j = h.offsets[segment]; j < h.offsets[segment + 1]; ++j) {
    for (int k = 0; k < h.pull_dim; ++k) sum[k] += h.records[j * h.pull_dim + k];
  }
  if (!use_cvm) return sum[2 + o];
  if (o == 0) return std::log1p(sum[0]);
  if (o == 1) return std::log1p(sum[1]) - std::log1p(sum[0]);
  return sum[o];
}

uint32_t bits_of(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  return bits;
}

// Forward into rows of ld = out_dim + dense_dim + 2: each pooled column against the float64
// oracle, the dense features copied, the padding kept, the bf16 rows the fp32 ones rounded.
void expect_forward(device::Card& card, const SlotSumPool& pool, const HostSlotBatch& h,
                    const std::vector<int>& begin, int dense_dim, bool use_cvm,
                    std::mt19937_64& rng) {
  const int batch = h.batch;
  const int64_t ld = pool.out_dim() + dense_dim + 2;
  const std::vector<float> dense = random_vector(static_cast<std::size_t>(batch) * dense_dim, rng);
  const PooledRows pooled = pool_into_rows(card, pool, h, dense, dense_dim, ld);
  const std::vector<float>& rows = pooled.f32;
  const std::vector<Bf16>& rows16 = pooled.bf16;
  for (int i = 0; i < batch; ++i) {
    for (int s = 0; s < h.slots; ++s) {
      for (int o = 0; o < begin[s + 1] - begin[s]; ++o) {
        const float got = rows[i * ld + begin[s] + o];
        ASSERT_NEAR(got, pooled_oracle(h, s * batch + i, o, use_cvm), 1e-5)
            << "instance " << i << " slot " << s << " column " << o;
        const uint32_t first = h.offsets[s * batch + i];
        if (!use_cvm && h.offsets[s * batch + i + 1] == first + 1) {
          // One key without cvm (the cpu's short loop): the general sum's -0.0f + field, bit
          // for bit (a -0.0f field stays -0.0f).
          const float want = -0.0f + h.records[first * h.pull_dim + 2 + o];
          ASSERT_EQ(bits_of(got), bits_of(want))
              << "instance " << i << " slot " << s << " column " << o;
        }
      }
    }
    for (int d = 0; d < dense_dim; ++d) {
      ASSERT_EQ(rows[i * ld + pool.out_dim() + d], dense[i * dense_dim + d]) << i << " " << d;
    }
    for (int64_t c = pool.out_dim() + dense_dim; c < ld; ++c) ASSERT_EQ(rows[i * ld + c], 7.0f);
    for (int64_t c = 0; c < ld; ++c) {
      ASSERT_EQ(rows16[i * ld + c].bits, to_bf16(rows[i * ld + c]).bits) << i << " " << c;
    }
  }
}

// Backward: show 1, click the label, then each column's scaled gradient; fields past a narrow
// slot's columns (and cvm's counters) carry none. `begin`: the slots' column offsets.
void expect_backward(device::Card& card, const SlotSumPool& pool, const HostSlotBatch& h,
                     const std::vector<int>& begin, bool use_cvm, std::mt19937_64& rng) {
  const int batch = h.batch;
  const int slots = h.slots;
  auto up = [&](const auto& host) { return device::to_device(host, card.memory(), card.stream()); };
  const float scale = 0.5f;
  const std::vector<float> d_pooled =
      random_vector(static_cast<std::size_t>(batch) * pool.out_dim(), rng);
  auto records = up(h.records);
  auto offsets = up(h.offsets);
  auto labels = up(h.labels);
  auto d_pooled_card = up(d_pooled);
  auto push = up(std::vector<float>(h.offsets.back() * pool.push_dim(), 9.0f));
  pool.backward(card.stream(), SlotBatchView{records.data(), offsets.data(), batch, slots},
                d_pooled_card.data(), pool.out_dim(), labels.data(), scale, push.data());
  const std::vector<float> pushed = to_host(push);
  const int cvm_columns = use_cvm ? 2 : 0;
  for (int s = 0; s < slots; ++s) {
    for (int i = 0; i < batch; ++i) {
      for (uint32_t j = h.offsets[s * batch + i]; j < h.offsets[s * batch + i + 1]; ++j) {
        const float* rec = pushed.data() + j * pool.push_dim();
        ASSERT_EQ(rec[0], 1.0f);
        ASSERT_EQ(rec[1], h.labels[i]);
        for (int f = 2; f < pool.push_dim(); ++f) {
          const int column = cvm_columns + f - 2;
          const float want = column < begin[s + 1] - begin[s]
                                 ? scale * d_pooled[i * pool.out_dim() + begin[s] + column]
                                 : 0.0f;
          ASSERT_EQ(rec[f], want) << "slot " << s << " instance " << i << " occurrence " << j
                                  << " field " << f;
        }
      }
    }
  }
}

class SlotPoolWidthTest : public ::testing::TestWithParam<bool>, protected testing::OneCard {};

TEST_P(SlotPoolWidthTest, WideRecordsNarrowSlotsAndWideDenseMatchTheOracles) {
  const bool use_cvm = GetParam();
  const int batch = 7, mf_dim = kGroup + 4, dense_dim = kGroup + 3;
  const std::vector<int> slot_dims = {0, kGroup - 2, kGroup - 1, kGroup, mf_dim};
  const int slots = static_cast<int>(slot_dims.size());
  std::mt19937_64 rng(use_cvm ? 61 : 62);
  const HostSlotBatch h = make_slot_batch(batch, slots, mf_dim, rng);
  SlotSumPool pool(card_, slot_dims, mf_dim, use_cvm);
  std::vector<int> begin(1, 0);
  for (int dim : slot_dims) begin.push_back(begin.back() + (use_cvm ? 2 : 0) + 1 + dim);
  ASSERT_EQ(pool.out_dim(), begin.back());

  expect_forward(card_, pool, h, begin, dense_dim, use_cvm, rng);
  expect_backward(card_, pool, h, begin, use_cvm, rng);
}

// Every segment one key (the cpu's short loops: forward without cvm, backward where the slot
// fills the record), with slots narrower than the records (backward's general path) beside
// them, and fields of -0.0f, +0.0f, a denormal and a large value: forward's columns are
// -0.0f + the field bit for bit, backward's push rows exactly the scaled gradients.
TEST_P(SlotPoolWidthTest, OneKeySegmentsMatchTheGeneralPathBitForBit) {
  const bool use_cvm = GetParam();
  const int batch = 9, mf_dim = kGroup + 4;
  const std::vector<int> slot_dims = {mf_dim, kGroup - 1, mf_dim, 0, 3};
  const int slots = static_cast<int>(slot_dims.size());
  std::mt19937_64 rng(use_cvm ? 65 : 66);
  HostSlotBatch h = make_slot_batch(batch, slots, mf_dim, rng);
  const float specials[] = {-0.0f, 0.0f, 1e-40f, -3e38f};
  HostSlotBatch one{{}, {0}, h.labels, batch, slots, h.pull_dim};
  for (int segment = 0; segment < batch * slots; ++segment) {
    for (int k = 0; k < h.pull_dim; ++k) {
      const float v = k >= 2 && (segment + k) % 3 == 0 ? specials[(segment + k) % 4]
                                                       : h.records[segment % 20 * h.pull_dim + k];
      one.records.push_back(v);
    }
    one.offsets.push_back(static_cast<uint32_t>(segment + 1));
  }
  SlotSumPool pool(card_, slot_dims, mf_dim, use_cvm);
  std::vector<int> begin(1, 0);
  for (int dim : slot_dims) begin.push_back(begin.back() + (use_cvm ? 2 : 0) + 1 + dim);
  expect_forward(card_, pool, one, begin, 2, use_cvm, rng);
  expect_backward(card_, pool, one, begin, use_cvm, rng);
}

INSTANTIATE_TEST_SUITE_P(Cvm, SlotPoolWidthTest, ::testing::Bool());

// Forward and backward on a card of 3 threads over a batch past parallel_for's serial limit in
// work items, not a multiple of the cpu loops' instance tile: each thread's range of (slot,
// instance, group) items starts and ends inside a slot and a tile (forward: one also runs into
// the dense items), and every value is written once: the oracles' values, padding untouched.
TEST(SlotPool, OnTheCardsThreadsWritesEveryValueOnce) {
  device::CardSet cards = device::CardSet::from_list("0", 0, 1, 3);
  device::Card& card = cards.card(0);
  card.activate();
  for (const bool use_cvm : {false, true}) {
    SCOPED_TRACE(use_cvm);
    const int mf_dim = kGroup + 4;
    const std::vector<int> slot_dims = {0, kGroup - 2, kGroup, mf_dim, 3};
    std::mt19937_64 rng(use_cvm ? 63 : 64);
    const HostSlotBatch h = make_slot_batch(301, static_cast<int>(slot_dims.size()), mf_dim, rng);
    SlotSumPool pool(card, slot_dims, mf_dim, use_cvm);
    std::vector<int> begin(1, 0);
    for (int dim : slot_dims) begin.push_back(begin.back() + (use_cvm ? 2 : 0) + 1 + dim);
    ASSERT_GE(static_cast<std::size_t>(h.batch) * slot_dims.size() * 2, device::kSerialLoopLimit);
    expect_forward(card, pool, h, begin, kGroup + 3, use_cvm, rng);
    expect_backward(card, pool, h, begin, use_cvm, rng);
  }
}

}  // namespace
}  // namespace gpubox::trainer
