// xdeepfm (XdeepfmPart, cin.cu) against a float64 reference written from the network's
// definition (PaddleRec's models/rank/xdeepfm net.py: the first-order term, the fields' embeddings
// with the dense features' x_i e_i, the CIN's layers X^{k+1}[o, d] = sum W[f, h, o] X^0[f, d]
// X^k[h, d] summed over d into the logit, the DNN over the fields): its predictions, and every
// gradient (dense parameters and pulled values) against central differences of the reference's
// summed log loss; its shapes and flops (PaddleRec's config.yaml by hand); its refusals.
#include <gtest/gtest.h>

#include <cmath>
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

using Matrix = std::vector<std::vector<double>>;  // [rows][D]

// The CIN's term from the fields X^0.
double cin_term(const DenseModelConfig& cfg, const Matrix& x0, const testing::NamedParams& p) {
  const std::size_t fields = x0.size(), width = cfg.mf_dim;
  Matrix xk = x0;
  std::vector<double> sums;
  for (std::size_t k = 0; k < cfg.cin_layer_sizes.size(); ++k) {
    const std::size_t out = cfg.cin_layer_sizes[k], height = xk.size();
    const std::string name = "cin_" + std::to_string(k) + ".w";
    Matrix next(out, std::vector<double>(width, 0.0));
    for (std::size_t o = 0; o < out; ++o) {
      for (std::size_t d = 0; d < width; ++d) {
        for (std::size_t f = 0; f < fields; ++f) {
          for (std::size_t hh = 0; hh < height; ++hh) {
            next[o][d] += p(name, (f * height + hh) * out + o) * x0[f][d] * xk[hh][d];
          }
        }
      }
      double sum = 0;
      for (std::size_t d = 0; d < width; ++d) sum += next[o][d];
      sums.push_back(sum);
    }
    xk = next;
  }
  double term = 0;
  for (std::size_t j = 0; j < sums.size(); ++j) term += sums[j] * p("cin_out.w", j);
  return term;
}

// The network's logit in float64, from the parameter blocks by name.
double xdeepfm_logit(const DenseModelConfig& cfg, const testing::HostBatch& h, int64_t i,
                     const testing::NamedParams& p, const std::vector<double>& rec) {
  const int width = cfg.mf_dim;
  Matrix x0;
  std::vector<double> cvm;
  double wide = 0;
  for (const std::vector<double>& sum : testing::pooled_slots(h, cfg, i, rec)) {
    cvm.push_back(std::log(sum[0] + 1));
    cvm.push_back(std::log(sum[1] + 1) - std::log(sum[0] + 1));
    wide += sum[2];
    x0.emplace_back(sum.begin() + 3, sum.end());
  }
  for (int f = 0; f < cfg.dense_dim; ++f) {
    const double x = h.dense[i * cfg.dense_dim + f];
    wide += x * p("wide.dense_w", f);
    std::vector<double> e(width);
    for (int d = 0; d < width; ++d) e[d] = x * p("xdeepfm.dense_w", f * width + d);
    x0.push_back(e);
  }
  std::vector<double> r;  // the DNN input: column d F + f, then the cvm features
  for (int d = 0; d < width; ++d) {
    for (const auto& field : x0) r.push_back(field[d]);
  }
  if (cfg.use_cvm) r.insert(r.end(), cvm.begin(), cvm.end());
  for (std::size_t l = 0; l <= cfg.fc_sizes.size(); ++l) {
    r = p.linear("fc_" + std::to_string(l), r, l < cfg.fc_sizes.size());
  }
  return r.at(0) + cin_term(cfg, x0, p) + wide;
}

class XdeepfmTest : public ::testing::TestWithParam<bool>, protected testing::OneCard {
 protected:
  DenseModelConfig config() const {
    DenseModelConfig cfg;
    cfg.kind = ModelKind::kXdeepfm;
    cfg.slots = 3;
    cfg.mf_dim = 3;
    cfg.dense_dim = 2;
    cfg.cin_layer_sizes = {4, 3};
    cfg.fc_sizes = {6};
    cfg.seed = 29;
    cfg.use_cvm = GetParam();
    return cfg;
  }
};

TEST_P(XdeepfmTest, PredictionsAndGradientsMatchAFloat64Reference) {
  const DenseModelConfig cfg = config();
  DenseModel model(card_, cfg);
  // The dense embeddings start at 1 (PaddleRec's); then every parameter is set random (the
  // zero-started ones too: wide.dense_w, the biases), so that each term moves the loss.
  const std::vector<float> w = model.parameters().values_to_host();
  for (const ParamBlock& b : model.parameters().blocks()) {
    if (b.name != "xdeepfm.dense_w") continue;
    for (std::size_t k = 0; k < b.count; ++k) EXPECT_EQ(w[b.offset + k], 1.0f) << k;
  }
  const std::size_t checked = testing::check_batch_sizes(
      card_, model, cfg.use_cvm ? 51 : 52,
      [&](const testing::HostBatch& h, int64_t i, const testing::NamedParams& p,
          const std::vector<double>& rec) { return xdeepfm_logit(cfg, h, i, p, rec); });
  EXPECT_GT(checked, 500u);
}

// The cpu forms' edges: two fields (one group of FirstFieldGrad's four, half empty), a CIN layer
// of 37 maps (PrevFieldGrad's chunks of 32 and a tail of 5) and an odd width.
TEST_P(XdeepfmTest, TwoFieldsAndWideLayersMatchAFloat64Reference) {
  DenseModelConfig cfg = config();
  cfg.slots = 1;
  cfg.dense_dim = 1;
  cfg.mf_dim = 5;
  cfg.cin_layer_sizes = {37, 3};
  DenseModel model(card_, cfg);
  testing::check_batch_sizes(
      card_, model, cfg.use_cvm ? 53 : 54,
      [&](const testing::HostBatch& h, int64_t i, const testing::NamedParams& p,
          const std::vector<double>& rec) { return xdeepfm_logit(cfg, h, i, p, rec); });
}

TEST_P(XdeepfmTest, ShapesAndFlops) {
  const DenseModelConfig cfg = config();
  DenseModel model(card_, cfg);
  // F = 3 slots + 2 dense = 5 fields of D = 3; the DNN reads 15 columns (+ 2 x 3 cvm).
  const std::size_t dnn_in = 15 + (cfg.use_cvm ? 6 : 0);
  std::size_t count = 0;
  for (const ParamBlock& b : model.parameters().blocks()) count += b.count;
  EXPECT_EQ(count, (dnn_in * 6 + 6) + (6 + 1) + 2 /* wide.dense_w */ + (25 * 4) + (20 * 3) +
                       7 /* cin_out.w */ + 2 * 3 /* xdeepfm.dense_w */);
  // The DNN's first layer hands back the 15 embedding columns' gradient; the CIN's layers are
  // GEMMs over D = 3 rows per example: forward, weight and input gradients.
  const double dnn = 6.0 * (2.0 * dnn_in + 15) + 1.0 * (3 * 6);
  const double cin = 3.0 * 3 * (25.0 * 4 + 20.0 * 3);
  EXPECT_DOUBLE_EQ(model.flops_per_example(), 2 * (dnn + cin));
}

// PaddleRec's models/rank/xdeepfm/config.yaml: 26 slots, 13 dense features, sparse_feature_dim 9
// (embed_w + 8), CIN 128-32, DNN 512-256-128 (layer_sizes_dnn). By hand: F = 39 fields of 8;
// CIN 3 x 8 x (39 x 39 x 128 + 39 x 128 x 32) = 8,506,368 multiply-adds; DNN over 312 columns:
// 512 x 312 x 3 + 256 x 512 x 3 + 128 x 256 x 3 + 128 x 3 = 971,136; x2.
TEST(XdeepfmFlops, PaddleRecConfig) {
  device::CardSet cards = device::CardSet::from_list("0");
  cards.card(0).activate();
  DenseModelConfig cfg;
  cfg.kind = ModelKind::kXdeepfm;
  cfg.slots = 26;
  cfg.mf_dim = 8;
  cfg.dense_dim = 13;
  cfg.cin_layer_sizes = {128, 32};
  cfg.fc_sizes = {512, 256, 128};
  DenseModel model(cards.card(0), cfg);
  EXPECT_DOUBLE_EQ(model.flops_per_example(), 2.0 * (8506368 + 971136));
}

TEST_P(XdeepfmTest, RefusesWhatTheCinCannotTake) {
  DenseModelConfig cfg = config();
  cfg.slot_dims = {3, 2, 3};
  const std::string why = testing::refusal(card_, cfg);
  EXPECT_NE(why.find("hyper_parameters.slot_dims"), std::string::npos) << why;
  cfg = config();
  cfg.cin_layer_sizes = {};
  EXPECT_THROW(DenseModel(card_, cfg), Error);
}

INSTANTIATE_TEST_SUITE_P(Cvm, XdeepfmTest, ::testing::Bool());

}  // namespace
}  // namespace gpubox::trainer
