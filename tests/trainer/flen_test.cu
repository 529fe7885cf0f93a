// flen (FlenPart, flen_part.cu) against a float64 reference written from the network's
// definition (flen_reference.hpp, PaddleRec's models/rank/flen net.py): its predictions and every
// gradient (dense parameters and pulled values) against central differences of the reference's
// summed log loss; its shapes and flops; refusals. Its dropout: dropout_test.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "heterps/device/card.hpp"
#include "tests/trainer/field_model_check.hpp"
#include "tests/trainer/flen_reference.hpp"
#include "tests/trainer/one_card.hpp"
#include "trainer/nn/dense_model.hpp"

namespace gpubox::trainer {
namespace {

class FlenTest : public ::testing::TestWithParam<bool>, protected testing::OneCard {
 protected:
  DenseModelConfig config() const {
    DenseModelConfig cfg;
    cfg.kind = ModelKind::kFlen;
    cfg.slots = 5;
    cfg.flen_groups = {2, 1, 2};
    cfg.mf_dim = 3;
    cfg.dense_dim = 2;
    cfg.fc_sizes = {6, 4};
    cfg.seed = 37;
    cfg.use_cvm = GetParam();
    return cfg;
  }
};

TEST_P(FlenTest, PredictionsAndGradientsMatchAFloat64Reference) {
  const DenseModelConfig cfg = config();
  DenseModel model(card_, cfg);
  const std::size_t checked = testing::check_batch_sizes(
      card_, model, cfg.use_cvm ? 71 : 72,
      [&](const testing::HostBatch& h, int64_t i, const testing::NamedParams& p,
          const std::vector<double>& rec) { return testing::flen_logit(cfg, h, i, p, rec); });
  EXPECT_GE(checked, 100u);
}

// Two groups (one pair) and groups of one slot each: the pair loop's ends.
TEST_P(FlenTest, OtherGroupings) {
  for (const std::vector<int>& groups : {std::vector<int>{3, 2}, std::vector<int>{1, 1, 1, 1, 1}}) {
    DenseModelConfig cfg = config();
    cfg.flen_groups = groups;
    DenseModel model(card_, cfg);
    testing::check_against_reference(
        card_, model, 73 + groups.size(),
        [&](const testing::HostBatch& h, int64_t i, const testing::NamedParams& p,
            const std::vector<double>& rec) { return testing::flen_logit(cfg, h, i, p, rec); });
  }
}

TEST_P(FlenTest, ShapesAndFlops) {
  const DenseModelConfig cfg = config();
  DenseModel model(card_, cfg);
  // The DNN reads 5 slots x (1 + 3) (+ 2 x 5 cvm) + 2 dense; flen: 3 pairs, a 4 x 4 layer with
  // its bias, 4 output weights; no wide part.
  const std::size_t dnn_in = 20 + 2 + (cfg.use_cvm ? 10 : 0);
  std::size_t count = 0;
  for (const ParamBlock& b : model.parameters().blocks()) {
    count += b.count;
    EXPECT_EQ(b.name.rfind("wide.", 0), std::string::npos) << b.name;
  }
  EXPECT_EQ(count, (dnn_in * 6 + 6) + (6 * 4 + 4) + (4 + 1) + 3 + 16 + 4 + 4);
  // The MLP as every network's: (2 in + dx_cols) out per layer; flen's own by its formula.
  const double pooled = 20 + (cfg.use_cvm ? 10 : 0);  // the first layer's dx_cols
  const double dnn = 6.0 * (2.0 * dnn_in + pooled) + 4.0 * (3 * 6) + 1.0 * (3 * 4);
  const double flen = 5 * 4 + 2.0 * 3 * 4 + 3.0 * 16 + 4.0 * 3 * 4 * 3;
  EXPECT_DOUBLE_EQ(model.flops_per_example(), 2 * (dnn + flen));
}

TEST_P(FlenTest, RefusesGroupsThatDoNotCoverTheSlots) {
  for (const std::vector<int>& groups :
       {std::vector<int>{2, 2}, std::vector<int>{5}, std::vector<int>{2, 0, 3}}) {
    DenseModelConfig cfg = config();
    cfg.flen_groups = groups;
    SCOPED_TRACE("groups of " + std::to_string(groups.size()));
    const std::string why = testing::refusal(card_, cfg);
    EXPECT_NE(why.find("field_group_sizes"), std::string::npos) << why;
  }
  DenseModelConfig cfg = config();
  cfg.slot_dims = {3, 2, 3, 3, 3};
  EXPECT_THROW(DenseModel model(card_, cfg), Error);
}

// bf16 (GPUBOX_BF16_EMULATION where the CPU has no bf16 GEMMs): the bi-interaction reads the
// pooled rows in bf16, beside the MLP's bf16 GEMMs; predictions, the pushed gradients and the
// dense gradients as a whole (relative L2 error) stay near the fp32 model's from the same weights.
TEST_P(FlenTest, Bf16StaysNearFp32) {
  // Measured when written, per block (without / with cvm): the MLP's first layer's weights
  // 0.14 / 0.085 (its bf16 dZ over this small batch), flen's fc_b 0.11 / 0.001 (ReLU masks flip
  // where u is near 0 at the start), the other blocks <= 0.09; the pushed gradients pass 0.05.
  testing::expect_bf16_near_fp32(card_, config(), 11, 0.15, 0.05);
}

// The bi-interaction's launches per step do not grow with the batch (no item loops over it: the
// sums over the batch are GEMVs): the same at 8, 512 and 2048 instances, and flen's own (the
// model's less the same config's dnn) 4 in the forward (group sums, fc sgemm, bias and ReLU, the
// logit's sgemv) and 8 in the backward (dlogits through the ReLU, dh's sgemm, the pooled
// gradient, the pairs' products, kernel_mf's and fc_b's sgemv, fc_w's sgemm, out_w's sgemv).
TEST_P(FlenTest, LaunchesPerStepDoNotGrowWithTheBatch) {
  if (gemm_fallback_forced()) GTEST_SKIP() << testing::kCountsAssumeFusedGemms;
  const DenseModelConfig cfg = config();
  DenseModel model(card_, cfg);
  DenseModelConfig dnn_cfg = cfg;
  dnn_cfg.kind = ModelKind::kDnn;
  DenseModel dnn(card_, dnn_cfg);
  for (const int64_t batch : {8, 512, 2048}) {
    SCOPED_TRACE("batch " + std::to_string(batch));
    EXPECT_EQ(testing::step_launches(card_, model, batch, 5),
              testing::step_launches(card_, dnn, batch, 5) + 12);
  }
}

INSTANTIATE_TEST_SUITE_P(Cvm, FlenTest, ::testing::Bool());

}  // namespace
}  // namespace gpubox::trainer
