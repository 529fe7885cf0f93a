// deepfefm (DeepfefmPart, deepfefm_part.cu) against a float64 reference written from the
// network's definition (PaddleRec's models/rank/deepfefm net.py: the first-order term, the fields'
// embeddings with the dense features' x_d e_d, r_p = v_a^T (W_p + W_p^T) v_b for every pair of
// fields summed into the logit, the DNN over [slot embeddings | x_d w_d | r]): its predictions and
// every gradient (dense parameters and pulled values) against central differences of the
// reference's summed log loss; its shapes and flops (PaddleRec's config.yaml by hand); refusals.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "heterps/device/card.hpp"
#include "tests/heterps/device/test_cards.hpp"
#include "tests/trainer/dropout_reference.hpp"
#include "tests/trainer/field_model_check.hpp"
#include "tests/trainer/one_card.hpp"
#include "trainer/nn/dense_model.hpp"

namespace gpubox::trainer {
namespace {

// deepfefm's logit of instance i in float64 (W row-major [in x out]): r_p for every pair (a < b)
// of fields in itertools.combinations order, as net.py loops them.
// With `drop`: the dnn's dropout (hyper_parameters.dnn_dropout), its hidden layers' and its
// output's (PaddleRec's DNN drops after its last Linear too).
double deepfefm_logit(const DenseModelConfig& cfg, const testing::HostBatch& h, int64_t i,
                      const testing::NamedParams& p, const std::vector<double>& rec,
                      const testing::DropoutReference& drop = {}) {
  const std::size_t k = cfg.mf_dim;
  std::vector<std::vector<double>> v;
  std::vector<double> emb, dense_terms, cvm;
  double first = 0;
  for (const std::vector<double>& sum : testing::pooled_slots(h, cfg, i, rec)) {
    cvm.push_back(std::log(sum[0] + 1));
    cvm.push_back(std::log(sum[1] + 1) - std::log(sum[0] + 1));
    first += sum[2];
    v.emplace_back(sum.begin() + 3, sum.end());
    emb.insert(emb.end(), sum.begin() + 3, sum.end());
  }
  for (int d = 0; d < cfg.dense_dim; ++d) {
    const double x = h.dense[i * cfg.dense_dim + d];
    first += x * p("wide.dense_w", d);
    dense_terms.push_back(x * p("wide.dense_w", d));
    std::vector<double> e(k);
    for (std::size_t c = 0; c < k; ++c) e[c] = x * p("deepfefm.dense_v", d * k + c);
    v.push_back(e);
  }
  std::vector<double> r;
  for (std::size_t a = 0; a < v.size(); ++a) {
    for (std::size_t b = a + 1; b < v.size(); ++b) {
      const std::size_t base = r.size() * k * k;
      double sum = 0;
      for (std::size_t x = 0; x < k; ++x) {
        for (std::size_t y = 0; y < k; ++y) {
          const double m =
              p("deepfefm.field_w", base + x * k + y) + p("deepfefm.field_w", base + y * k + x);
          sum += v[a][x] * m * v[b][y];
        }
      }
      r.push_back(sum);
    }
  }
  double second = 0;
  for (double value : r) second += value;
  std::vector<double> x = emb;  // the DNN input
  x.insert(x.end(), dense_terms.begin(), dense_terms.end());
  x.insert(x.end(), r.begin(), r.end());
  if (cfg.use_cvm) x.insert(x.end(), cvm.begin(), cvm.end());
  for (std::size_t l = 0; l <= cfg.fc_sizes.size(); ++l) {
    x = p.linear("fc_" + std::to_string(l), x, l < cfg.fc_sizes.size());
    drop(l, l == cfg.fc_sizes.size(), i, x);
  }
  return first + second + x.at(0);
}

class DeepFefmTest : public ::testing::TestWithParam<bool>, protected testing::OneCard {
 protected:
  DenseModelConfig config() const {
    DenseModelConfig cfg;
    cfg.kind = ModelKind::kDeepFefm;
    cfg.slots = 3;
    cfg.mf_dim = 3;
    cfg.dense_dim = 2;
    cfg.fc_sizes = {6};
    cfg.seed = 31;
    cfg.use_cvm = GetParam();
    return cfg;
  }
};

TEST_P(DeepFefmTest, PredictionsAndGradientsMatchAFloat64Reference) {
  const DenseModelConfig cfg = config();
  DenseModel model(card_, cfg);
  // Every parameter random (the zero-started ones too: wide.dense_w, the biases), so that each
  // term moves the loss.
  testing::check_batch_sizes(
      card_, model, cfg.use_cvm ? 61 : 62,
      [&](const testing::HostBatch& h, int64_t i, const testing::NamedParams& p,
          const std::vector<double>& rec) { return deepfefm_logit(cfg, h, i, p, rec); });
}

// The pair products' chunks of 8 columns: k = 11 (a whole chunk and a tail of 3), and the
// fewest fields, 2 (one pair).
TEST_P(DeepFefmTest, WideFactorsAndTwoFieldsMatchAFloat64Reference) {
  for (const auto& [slots, dense_dim] : {std::pair{2, 1}, std::pair{1, 1}}) {
    SCOPED_TRACE(std::to_string(slots) + " slots, " + std::to_string(dense_dim) + " dense");
    DenseModelConfig cfg = config();
    cfg.slots = slots;
    cfg.dense_dim = dense_dim;
    cfg.mf_dim = 11;
    DenseModel model(card_, cfg);
    testing::check_batch_sizes(
        card_, model, cfg.use_cvm ? 63 : 64,
        [&](const testing::HostBatch& h, int64_t i, const testing::NamedParams& p,
            const std::vector<double>& rec) { return deepfefm_logit(cfg, h, i, p, rec); });
  }
}

// PaddleRec's deepfefm dropout (0.2 after every DNN Linear and ReLU, its output's too): the
// hidden units and the dnn's output dropped, the first- and second-order terms not, at step 1.
TEST_P(DeepFefmTest, DropoutMatchesAFloat64ReferenceWithTheSameMask) {
  for (const float p : {0.2f, 0.5f}) {
    SCOPED_TRACE("dnn_dropout " + std::to_string(p));
    DenseModelConfig cfg = config();
    cfg.fc_sizes = {6, 4};
    cfg.dnn_dropout = p;
    DenseModel model(card_, cfg);
    ASSERT_TRUE(model.dropout().drops_output());
    for (const int64_t batch : {9, 1}) {
      model.set_dropout_steps(0);
      const testing::DropoutReference drop{&model.dropout(), p, 1};
      testing::check_against_reference(
          card_, model, 70 + batch,
          [&](const testing::HostBatch& h, int64_t i, const testing::NamedParams& w,
              const std::vector<double>& rec) { return deepfefm_logit(cfg, h, i, w, rec, drop); },
          batch);
    }
  }
}

TEST_P(DeepFefmTest, ShapesAndFlops) {
  const DenseModelConfig cfg = config();
  DenseModel model(card_, cfg);
  // F = 3 slots + 2 dense = 5 fields of k = 3, 10 pairs; the DNN reads 3 x 3 + 2 + 10 = 21
  // columns (+ 2 x 3 cvm), every one of the 21 with a gradient.
  const std::size_t dnn_in = 21 + (cfg.use_cvm ? 6 : 0);
  std::size_t count = 0;
  for (const ParamBlock& b : model.parameters().blocks()) count += b.count;
  EXPECT_EQ(count, (dnn_in * 6 + 6) + (6 + 1) + 2 /* wide.dense_w */ + 10 * 3 * 3 +
                       2 * 3 /* deepfefm.dense_v */);
  const double dnn = 6.0 * (2.0 * dnn_in + 21) + 1.0 * (3 * 6);
  const double fefm = 10.0 * ((9 + 3) + 4.0 * 9);
  EXPECT_DOUBLE_EQ(model.flops_per_example(), 2 * (dnn + fefm));
}

// PaddleRec's models/rank/deepfefm/config.yaml: 26 slots, 13 dense features, sparse_feature_dim 9
// (embed_w + 8), fc_sizes 512-256-128-32. By hand: F = 39 fields of 8, 741 pair matrices of 8 x 8
// (47,424 values); the FEFM 741 x (72 + 256) = 243,048 multiply-adds; the DNN over 26 x 8 + 13 +
// 741 = 962 columns: 512 x 962 x 3 + 256 x 512 x 3 + 128 x 256 x 3 + 32 x 128 x 3 + 3 x 32 =
// 1,981,536; x2.
TEST(DeepFefmFlops, PaddleRecConfig) {
  device::CardSet cards = device::CardSet::from_list("0");
  cards.card(0).activate();
  DenseModelConfig cfg;
  cfg.kind = ModelKind::kDeepFefm;
  cfg.slots = 26;
  cfg.mf_dim = 8;
  cfg.dense_dim = 13;
  cfg.fc_sizes = {512, 256, 128, 32};
  DenseModel model(cards.card(0), cfg);
  EXPECT_DOUBLE_EQ(model.flops_per_example(), 2.0 * (243048 + 1981536));
  for (const ParamBlock& b : model.parameters().blocks()) {
    if (b.name == "deepfefm.field_w") {
      EXPECT_EQ(b.count, 741u * 8 * 8);
    }
  }
}

TEST_P(DeepFefmTest, RefusesSlotsOfSeveralWidths) {
  DenseModelConfig cfg = config();
  cfg.slot_dims = {3, 2, 3};
  const std::string why = testing::refusal(card_, cfg);
  EXPECT_NE(why.find("hyper_parameters.slot_dims"), std::string::npos) << why;
}

INSTANTIATE_TEST_SUITE_P(Cvm, DeepFefmTest, ::testing::Bool());

}  // namespace
}  // namespace gpubox::trainer
