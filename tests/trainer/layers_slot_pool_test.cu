// The slot pool (SlotSumPool) as a layer: its forward against a naive reference and its
// backward, the push records it scatters, against float64 central differences; long segments in
// the fixed chunked order, an empty batch, a wrong slot count, and the pooled and dense features
// written into strided rows. Its widths past one work item: slot_pool_test.cu.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <tuple>
#include <vector>

#include "heterps/device/card.hpp"
#include "tests/trainer/layers_test_fixture.hpp"
#include "tests/trainer/slot_batch.hpp"
#include "tests/trainer/test_util.hpp"
#include "trainer/nn/layers.hpp"

namespace gpubox::trainer {
namespace {
using device::to_host;
using testing::central_difference;
using testing::expect_gradient_near;
using testing::LayersTest;
using testing::random_vector;
using testing::weighted_sum;

// (use_cvm, mf_dim): records of 5 and of 20 fields, one group of columns a work item on the cpu
// backend and two (slot_pool.cu's kColumnsPerItem).
class SlotPoolTest : public LayersTest,
                     public ::testing::WithParamInterface<std::tuple<bool, int>> {};

TEST_P(SlotPoolTest, ForwardMatchesReferenceAndBackwardScattersNumericalGradient) {
  const bool use_cvm = std::get<0>(GetParam());
  const int batch = 5, slots = 3, mf_dim = std::get<1>(GetParam());
  const float scale = 2.0f;
  std::mt19937_64 rng(use_cvm ? 21 : 22);
  HostSlotBatch h = make_slot_batch(batch, slots, mf_dim, rng);
  SlotSumPool pool(slots, mf_dim, use_cvm);
  ASSERT_EQ(pool.width(), (use_cvm ? 3 : 1) + mf_dim);
  const std::vector<float> r = random_vector(static_cast<std::size_t>(batch) * pool.out_dim(), rng);
  auto offsets = up(h.offsets);
  auto pooled = card_.make_buffer<float>(batch * pool.out_dim());
  auto run = [&] {
    auto records = up(h.records);
    pool.forward(card_.stream(), SlotBatchView{records.data(), offsets.data(), batch, slots},
                 nullptr, 0, InputRows{pooled.data(), pool.out_dim(), ElementType::kF32});
    return weighted_sum(to_host(pooled), r);
  };
  run();
  // Forward reference.
  std::vector<float> got = to_host(pooled);
  for (int s = 0; s < slots; ++s) {
    for (int i = 0; i < batch; ++i) {
      std::vector<double> sum(h.pull_dim, 0.0);
      for (uint32_t j = h.offsets[s * batch + i]; j < h.offsets[s * batch + i + 1]; ++j) {
        for (int k = 0; k < h.pull_dim; ++k) sum[k] += h.records[j * h.pull_dim + k];
      }
      const float* block = got.data() + i * pool.out_dim() + s * pool.width();
      int c = 0;
      if (use_cvm) {
        EXPECT_NEAR(block[c++], std::log(sum[0] + 1), 1e-5);
        EXPECT_NEAR(block[c++], std::log(sum[1] + 1) - std::log(sum[0] + 1), 1e-5);
      }
      for (int k = 2; k < h.pull_dim; ++k) EXPECT_NEAR(block[c++], sum[k], 1e-5);
    }
  }
  // Backward: push records per occurrence.
  auto records = up(h.records);
  auto labels = up(h.labels);
  auto d_pooled = up(r);
  const std::size_t occurrences = h.offsets.back();
  auto push = card_.make_buffer<float>(occurrences * pool.push_dim());
  pool.backward(card_.stream(), SlotBatchView{records.data(), offsets.data(), batch, slots},
                d_pooled.data(), pool.out_dim(), labels.data(), scale, push.data());
  std::vector<float> push_host = to_host(push);
  for (int s = 0; s < slots; ++s) {
    for (int i = 0; i < batch; ++i) {
      for (uint32_t j = h.offsets[s * batch + i]; j < h.offsets[s * batch + i + 1]; ++j) {
        const float* rec = push_host.data() + j * pool.push_dim();
        EXPECT_EQ(rec[0], 1.0f);
        EXPECT_EQ(rec[1], h.labels[i]);
        for (int k = 2; k < h.pull_dim; ++k) {
          const double numeric = central_difference(h.records, j * h.pull_dim + k, 1e-2f, run);
          expect_gradient_near(rec[k], scale * numeric, 1e-4, 1e-3,
                               "occurrence " + std::to_string(j) + " field " + std::to_string(k));
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(CvmAndWidth, SlotPoolTest,
                         ::testing::Combine(::testing::Bool(), ::testing::Values(2, 17)));

// A multi-valued slot can give one instance thousands of keys: the pooled sums follow the fixed
// chunked order (heterps/heter_comm/segment_reduce.cuh). Short segments keep the old
// left-to-right order bit for bit; every sum is within float rounding of a float64 oracle.
TEST_F(LayersTest, SlotPoolLongSegmentsMatchFloat64AndShortOnesTheOldOrder) {
  const int batch = 4, slots = 2, mf_dim = 3, pull_dim = 3 + mf_dim;
  const std::vector<int> lengths = {0, 1, 31, 32, 33, 5000, 2, 1025};  // slot-major segments
  std::mt19937_64 rng(31);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  std::vector<float> records;
  std::vector<uint32_t> offsets = {0};
  for (int len : lengths) {
    for (int j = 0; j < len; ++j) {
      records.push_back(1.0f);
      records.push_back(static_cast<float>(rng() % 2));
      for (int k = 0; k < 1 + mf_dim; ++k) records.push_back(value(rng));
    }
    offsets.push_back(offsets.back() + static_cast<uint32_t>(len));
  }
  SlotSumPool pool(slots, mf_dim, /*use_cvm=*/false);
  auto d_records = up(records);
  auto d_offsets = up(offsets);
  auto pooled = card_.make_buffer<float>(batch * pool.out_dim());
  pool.forward(card_.stream(), SlotBatchView{d_records.data(), d_offsets.data(), batch, slots},
               nullptr, 0, InputRows{pooled.data(), pool.out_dim(), ElementType::kF32});
  const std::vector<float> got = to_host(pooled);
  for (int segment = 0; segment < slots * batch; ++segment) {
    const int s = segment / batch, i = segment % batch;
    for (int k = 2; k < pull_dim; ++k) {
      double exact = 0, magnitude = 0;
      float left_to_right = 0.0f;
      for (uint32_t j = offsets[segment]; j < offsets[segment + 1]; ++j) {
        const float v = records[j * pull_dim + k];
        exact += v;
        magnitude += std::fabs(v);
        left_to_right += v;
      }
      const float sum = got[i * pool.out_dim() + s * pool.width() + (k - 2)];
      const int len = lengths[segment];
      EXPECT_LE(std::fabs(sum - exact), 1e-7 * (len + 1) * magnitude) << segment << " " << k;
      if (len <= 32) {
        EXPECT_EQ(sum, left_to_right) << segment << " " << k;
      }
    }
  }
}

TEST_F(LayersTest, SlotPoolEmptyBatchAndWrongSlotCount) {
  SlotSumPool pool(2, 3, true);
  std::vector<uint32_t> zero{0};
  auto offsets = up(zero);
  const InputRows rows{nullptr, pool.out_dim() + 4, ElementType::kF32};
  pool.forward(card_.stream(), SlotBatchView{nullptr, offsets.data(), 0, 2}, nullptr, 4, rows);
  EXPECT_THROW(
      pool.forward(card_.stream(), SlotBatchView{nullptr, offsets.data(), 0, 3}, nullptr, 4, rows),
      Error);
  // Rows too short for the pooled slots and the dense features.
  EXPECT_THROW(
      pool.forward(card_.stream(), SlotBatchView{nullptr, offsets.data(), 0, 2}, nullptr, 5, rows),
      Error);
}

// The concat in place: each row of the first layer's input is [pooled slots | dense features],
// at its row stride, in fp32 or rounded to bf16; the padding behind a row is left alone.
TEST_F(LayersTest, SlotPoolWritesPooledAndDenseFeaturesIntoStridedRows) {
  const int batch = 6, slots = 3, mf_dim = 2, dense_dim = 5, pad = 3;
  std::mt19937_64 rng(41);
  HostSlotBatch h = make_slot_batch(batch, slots, mf_dim, rng);
  SlotSumPool pool(slots, mf_dim, /*use_cvm=*/true);
  const int64_t ld = pool.out_dim() + dense_dim + pad;
  const std::vector<float> dense = random_vector(static_cast<std::size_t>(batch) * dense_dim, rng);
  const PooledRows strided = pool_into_rows(card_, pool, h, dense, dense_dim, ld);
  const std::vector<float>& rows = strided.f32;
  const std::vector<Bf16>& rows16 = strided.bf16;
  // The pooled columns as the fp32-only layout computes them.
  auto records = up(h.records);
  auto offsets = up(h.offsets);
  auto pooled = card_.make_buffer<float>(batch * pool.out_dim());
  pool.forward(card_.stream(), SlotBatchView{records.data(), offsets.data(), batch, slots}, nullptr,
               0, InputRows{pooled.data(), pool.out_dim(), ElementType::kF32});
  const std::vector<float> want = to_host(pooled);
  for (int i = 0; i < batch; ++i) {
    for (int64_t c = 0; c < ld; ++c) {
      float expected = 7.0f;  // padding
      if (c < pool.out_dim()) {
        expected = want[i * pool.out_dim() + c];
      } else if (c < pool.out_dim() + dense_dim) {
        expected = dense[i * dense_dim + (c - pool.out_dim())];
      }
      EXPECT_EQ(rows[i * ld + c], expected) << i << " " << c;
      EXPECT_EQ(rows16[i * ld + c].bits, to_bf16(expected).bits) << i << " " << c;
    }
  }
}

}  // namespace
}  // namespace gpubox::trainer
