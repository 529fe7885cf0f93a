// dlrm (DlrmPart, dot_interaction.cu) against a float64 reference written from the network's
// definition (PaddleRec's models/rank/dlrm net.py: bottom MLP, the upper triangle of the
// products among the slots' embeddings and the bottom output, the top MLP over both): its
// predictions, and every gradient (dense parameters and pulled values) against central
// differences of the reference's summed log loss; its shapes and flops; its refusals; bf16 near
// fp32.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "heterps/device/card.hpp"
#include "tests/heterps/device/test_cards.hpp"
#include "tests/trainer/field_model_check.hpp"
#include "tests/trainer/one_card.hpp"
#include "trainer/nn/dense_model.hpp"

namespace gpubox::trainer {
namespace {

// Instance i's logit in float64, from the parameter blocks by name.
double dlrm_logit(const DenseModelConfig& cfg, const testing::HostBatch& h, int64_t i,
                  const testing::NamedParams& p, const std::vector<double>& rec) {
  const int d = 1 + cfg.mf_dim;
  std::vector<double> x(h.dense.begin() + i * cfg.dense_dim,
                        h.dense.begin() + (i + 1) * cfg.dense_dim);
  for (std::size_t l = 0; l < cfg.bot_layer_sizes.size(); ++l) {
    x = p.linear("bot_" + std::to_string(l), x, true);
  }
  std::vector<std::vector<double>> t;
  std::vector<double> cvm;
  for (const std::vector<double>& sum : testing::pooled_slots(h, cfg, i, rec)) {
    cvm.push_back(std::log(sum[0] + 1));
    cvm.push_back(std::log(sum[1] + 1) - std::log(sum[0] + 1));
    t.emplace_back(sum.begin() + 2, sum.end());
  }
  t.push_back(x);
  std::vector<double> r = x;  // R = [b | pairs | cvm]
  for (std::size_t a = 0; a < t.size(); ++a) {
    for (std::size_t b = a + 1; b < t.size(); ++b) {
      double dot = 0;
      for (int k = 0; k < d; ++k) dot += t[a][k] * t[b][k];
      r.push_back(dot);
    }
  }
  if (cfg.use_cvm) r.insert(r.end(), cvm.begin(), cvm.end());
  for (std::size_t l = 0; l <= cfg.fc_sizes.size(); ++l) {
    r = p.linear("fc_" + std::to_string(l), r, l < cfg.fc_sizes.size());
  }
  return r.at(0);
}

class DenseModelFlops : public ::testing::Test, protected testing::OneCard {};

class DlrmTest : public ::testing::TestWithParam<bool>, protected testing::OneCard {
 protected:
  DenseModelConfig config() const {
    DenseModelConfig cfg;
    cfg.kind = ModelKind::kDlrm;
    cfg.slots = 3;
    cfg.mf_dim = 3;
    cfg.dense_dim = 2;
    cfg.bot_layer_sizes = {5, 4};
    cfg.fc_sizes = {6};
    cfg.seed = 23;
    cfg.use_cvm = GetParam();
    return cfg;
  }
};

TEST_P(DlrmTest, PredictionsAndGradientsMatchAFloat64Reference) {
  const DenseModelConfig cfg = config();
  DenseModel model(card_, cfg);
  const std::size_t checked = testing::check_batch_sizes(
      card_, model, cfg.use_cvm ? 41 : 42,
      [&](const testing::HostBatch& h, int64_t i, const testing::NamedParams& p,
          const std::vector<double>& rec) { return dlrm_logit(cfg, h, i, p, rec); });
  EXPECT_GT(checked, 300u);
}

// Vectors of d = 16, 17 and 21: the forward's dot products take four columns at a time
// (dot_interaction.cu), the cpu backward's blocks sixteen, so d = 21 has five groups and a tail
// of one, one block and a tail of five; the pool's work items two groups of fields.
TEST_P(DlrmTest, WideVectorsMatchAFloat64Reference) {
  for (const int d : {16, 17, 21}) {
    SCOPED_TRACE("d = " + std::to_string(d));
    DenseModelConfig cfg = config();
    cfg.mf_dim = d - 1;
    cfg.bot_layer_sizes = {5, d};
    DenseModel model(card_, cfg);
    const std::size_t checked = testing::check_batch_sizes(
        card_, model, cfg.use_cvm ? 43 : 44,
        [&](const testing::HostBatch& h, int64_t i, const testing::NamedParams& p,
            const std::vector<double>& rec) { return dlrm_logit(cfg, h, i, p, rec); });
    EXPECT_GT(checked, 300u);
  }
}

TEST_P(DlrmTest, ShapesAndFlops) {
  const DenseModelConfig cfg = config();
  DenseModel model(card_, cfg);
  // F = 3 slots + the bottom output = 4 vectors of d = 4: 6 pairs; R = 4 + 6 (+ 2 x 3 cvm).
  const std::size_t top_in = 10 + (cfg.use_cvm ? 6 : 0);
  std::size_t count = 0;
  for (const ParamBlock& b : model.parameters().blocks()) count += b.count;
  EXPECT_EQ(count, (2 * 5 + 5) + (5 * 4 + 4) + (top_in * 6 + 6) + (6 + 1));
  // The bottom: no input gradient for the dense features; the top: every column of R;
  // the interaction: 6 pairs x 4 forward, twice that backward.
  const double bottom = 5.0 * (2 * 2) + 4.0 * (3 * 5);
  const double top = 6.0 * (3.0 * top_in) + 1.0 * (3 * 6);
  EXPECT_DOUBLE_EQ(model.flops_per_example(), 2 * (bottom + top + 3 * 6 * 4));
}

// PaddleRec's models/rank/dlrm/config.yaml: 26 slots, 13 dense features, bottom 512-256-64-16,
// sparse_feature_dim 16, top 512-256 (+ the logit). By hand: bottom 13*512*2 + 256*512*3 +
// 64*256*3 + 16*64*3 = 458,752 multiply-adds; 351 pairs of 16: 16,848; top over 16 + 351 = 367
// columns: 512*367*3 + 256*512*3 + 256*3 = 957,696; x2.
TEST_F(DenseModelFlops, PaddleRecDlrmConfig) {
  DenseModelConfig cfg;
  cfg.kind = ModelKind::kDlrm;
  cfg.slots = 26;
  cfg.mf_dim = 15;
  cfg.dense_dim = 13;
  cfg.bot_layer_sizes = {512, 256, 64, 16};
  cfg.fc_sizes = {512, 256};
  DenseModel model(card_, cfg);
  EXPECT_DOUBLE_EQ(model.flops_per_example(), 2.0 * (458752 + 16848 + 957696));
}

TEST_P(DlrmTest, RefusesWidthsTheInteractionCannotTake) {
  DenseModelConfig cfg = config();
  cfg.bot_layer_sizes = {5, 3};
  const std::string why = testing::refusal(card_, cfg);  // narrower than the embeddings
  EXPECT_NE(why.find("the last of hyper_parameters.bot_layer_sizes: 3"), std::string::npos) << why;
  EXPECT_NE(why.find("hyper_parameters.sparse_feature_dim: 4"), std::string::npos) << why;
  cfg = config();
  cfg.slot_dims = {3, 2, 3};
  EXPECT_THROW(DenseModel(card_, cfg), Error);
  cfg = config();
  cfg.dense_dim = 0;
  EXPECT_THROW(DenseModel(card_, cfg), Error);
}

// bf16 (GPUBOX_BF16_EMULATION where the CPU has no bf16 GEMMs): the bottom MLP, R and the
// interaction's vectors in bf16 stay within bf16's rounding of the fp32 model from the same
// weights: predictions, and every gradient as a whole (relative L2 error).
TEST_P(DlrmTest, Bf16StaysNearFp32) {
  testing::expect_bf16_near_fp32(card_, config(), 7, 0.05, 0.05);
}

INSTANTIATE_TEST_SUITE_P(Cvm, DlrmTest, ::testing::Bool());

}  // namespace
}  // namespace gpubox::trainer
