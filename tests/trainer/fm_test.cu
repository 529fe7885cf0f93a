// deepfm's and fm's pairwise term (FmPart, fm_part.cu): the forward against the pairwise sum in
// float64 (sum over s < t of <v_s, v_t>, the definition, not the square-of-sums identity the layer
// computes), the backward against central differences, added onto the pooled gradient already
// there; other columns (cvm, embed_w, dense features) get nothing. Rows strided wider than the
// pooled slots. Edge shapes: batch 0, 1 and n; one slot (no pair) and several; embedx widths
// inside one and across two of the cpu loop's column blocks (16); fp32 and bf16 rows.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "heterps/device/card.hpp"
#include "tests/trainer/one_card.hpp"
#include "tests/trainer/test_util.hpp"
#include "trainer/nn/bf16.hpp"
#include "trainer/nn/layers.hpp"

namespace gpubox::trainer {
namespace {
using device::to_device;
using device::to_host;
using testing::central_difference;
using testing::expect_gradient_near;
using testing::random_vector;
using testing::weighted_sum;

struct FmCase {
  int batch, slots, mf_dim;
  bool use_cvm;
};

std::string case_name(const FmCase& c) {
  return "batch_" + std::to_string(c.batch) + "_slots_" + std::to_string(c.slots) + "_mf_" +
         std::to_string(c.mf_dim) + (c.use_cvm ? "_cvm" : "");
}

class FmPartTest : public ::testing::TestWithParam<FmCase>, protected testing::OneCard {
 protected:
  // The pairwise term of instance i of `rows` in float64.
  static double pairwise(const std::vector<float>& rows, const SlotSumPool& pool, int64_t ld,
                         int i) {
    const FmCase c = GetParam();
    const int embedx = pool.embed_w_column() + 1;
    double sum = 0;
    for (int s = 0; s < c.slots; ++s) {
      for (int t = s + 1; t < c.slots; ++t) {
        for (int k = 0; k < c.mf_dim; ++k) {
          sum += double{rows[i * ld + s * pool.width() + embedx + k]} *
                 rows[i * ld + t * pool.width() + embedx + k];
        }
      }
    }
    return sum;
  }
};

TEST_P(FmPartTest, MatchesPairwiseFloat64AndNumericalGradients) {
  const FmCase c = GetParam();
  std::mt19937_64 rng(41 + c.batch + 3 * c.slots + 7 * c.mf_dim + (c.use_cvm ? 1 : 0));
  SlotSumPool pool(c.slots, c.mf_dim, c.use_cvm);
  FmPart fm(pool);
  const int64_t ld = pool.out_dim() + 3;  // as if 3 dense features followed
  const auto n = static_cast<std::size_t>(c.batch);
  std::vector<float> rows = random_vector(n * ld, rng);
  const std::vector<float> base = random_vector(n, rng);
  const std::vector<float> r = random_vector(n, rng);
  auto logits = card_.make_buffer<float>(n);
  auto run = [&] {
    auto dr = up(rows);
    device::copy_async(logits.data(), base.data(), n, card_.stream());
    fm.forward(card_.stream(), InputRows{dr.data(), ld, ElementType::kF32}, c.batch, logits.data());
    return weighted_sum(to_host(logits), r);
  };
  run();
  const std::vector<float> got = to_host(logits);
  ASSERT_EQ(got.size(), n);
  for (int i = 0; i < c.batch; ++i) {
    EXPECT_NEAR(got[i], base[i] + pairwise(rows, pool, ld, i), 1e-5) << "instance " << i;
  }
  const std::vector<float> d_init = random_vector(n * pool.out_dim(), rng);
  auto d_pooled = up(d_init);
  auto dr = up(rows);
  auto dz = up(r);
  fm.backward(card_.stream(), InputRows{dr.data(), ld, ElementType::kF32}, dz.data(), c.batch,
              d_pooled.data(), pool.out_dim());
  const std::vector<float> dp = to_host(d_pooled);
  for (int i = 0; i < c.batch; ++i) {
    for (int col = 0; col < pool.out_dim(); ++col) {
      const std::size_t at = static_cast<std::size_t>(i) * pool.out_dim() + col;
      const double numeric = central_difference(rows, i * ld + col, 1e-2f, run);
      expect_gradient_near(dp[at] - d_init[at], numeric, 1e-4, 1e-3,
                           "pooled " + std::to_string(i) + "," + std::to_string(col));
    }
  }
  // An empty batch writes no logit.
  auto untouched = up(std::vector<float>{7.0f});
  fm.forward(card_.stream(), InputRows{dr.data(), ld, ElementType::kF32}, 0, untouched.data());
  EXPECT_EQ(to_host(untouched), std::vector<float>{7.0f});
}

// bf16 rows: the same term of the rounded values (the layer widens each to fp32).
TEST_P(FmPartTest, Bf16RowsMatchFloat64OfTheRoundedValues) {
  const FmCase c = GetParam();
  std::mt19937_64 rng(91 + c.batch + c.mf_dim);
  SlotSumPool pool(c.slots, c.mf_dim, c.use_cvm);
  const int64_t ld = pool.out_dim() + 3;
  const auto n = static_cast<std::size_t>(c.batch);
  std::vector<float> rows = random_vector(n * ld, rng);
  std::vector<Bf16> rows16(rows.size());
  for (std::size_t k = 0; k < rows.size(); ++k) {
    rows16[k] = to_bf16(rows[k]);
    rows[k] = to_float(rows16[k]);
  }
  auto logits = card_.make_buffer<float>(n);
  device::memset_bytes_async(logits.data(), 0, logits.bytes(), card_.stream());
  auto dr = up(rows16);
  FmPart(pool).forward(card_.stream(), InputRows{dr.data(), ld, ElementType::kBf16}, c.batch,
                       logits.data());
  const std::vector<float> got = to_host(logits);
  for (int i = 0; i < c.batch; ++i) {
    EXPECT_NEAR(got[i], pairwise(rows, pool, ld, i), 1e-5) << "instance " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, FmPartTest,
                         ::testing::Values(FmCase{5, 4, 3, false}, FmCase{5, 4, 3, true},
                                           FmCase{0, 4, 3, true}, FmCase{1, 4, 19, false},
                                           FmCase{3, 1, 3, true}, FmCase{4, 6, 16, true},
                                           FmCase{6, 3, 33, false}),
                         [](const ::testing::TestParamInfo<FmCase>& info) {
                           return case_name(info.param);
                         });

}  // namespace
}  // namespace gpubox::trainer
