// ffm (FfmPart, ffm_part.cu) against a float64 reference written from the network's definition
// (PaddleRec's models/rank/ffm net.py: first order over the keys and the dense features, a bias,
// and sum_{a<b} <V(a, b), V(b, a)> over the fields, sparse slots and dense features alike, a
// dense feature's factor being its value times a trained vector): its predictions and every
// gradient (dense parameters and pulled values) against central differences of the reference's
// summed log loss; its shapes; its refusals.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "heterps/device/card.hpp"
#include "tests/heterps/device/test_cards.hpp"
#include "tests/trainer/field_model_check.hpp"
#include "tests/trainer/one_card.hpp"
#include "trainer/nn/dense_model.hpp"

namespace gpubox::trainer {
namespace {

// ffm's logit of instance i in float64: first order + bias + sum over field pairs of
// <V(a,b), V(b,a)>, a slot's factors from its pooled row, a dense feature's from ffm.dense_v.
double ffm_logit(const DenseModelConfig& cfg, const testing::HostBatch& h, int64_t i,
                 const testing::NamedParams& p, const std::vector<double>& rec) {
  const int fields = cfg.slots + cfg.dense_dim;
  const int k = cfg.mf_dim / fields;
  double z = p("wide.bias", 0);
  // factors[a][b]: field a's factor toward field b.
  std::vector<std::vector<std::vector<double>>> factors(
      fields, std::vector<std::vector<double>>(fields, std::vector<double>(k)));
  const std::vector<std::vector<double>> slots = testing::pooled_slots(h, cfg, i, rec);
  for (int s = 0; s < cfg.slots; ++s) {
    const std::vector<double>& sum = slots[s];
    z += sum[2];  // embed_w: the first-order weight
    for (int b = 0; b < fields; ++b) {
      for (int c = 0; c < k; ++c) factors[s][b][c] = sum[3 + b * k + c];
    }
  }
  for (int d = 0; d < cfg.dense_dim; ++d) {
    const double x = h.dense[i * cfg.dense_dim + d];
    z += x * p("wide.dense_w", d);
    for (int b = 0; b < fields; ++b) {
      for (int c = 0; c < k; ++c) {
        factors[cfg.slots + d][b][c] = x * p("ffm.dense_v", (d * fields + b) * k + c);
      }
    }
  }
  for (int a = 0; a < fields; ++a) {
    for (int b = a + 1; b < fields; ++b) {
      for (int c = 0; c < k; ++c) z += factors[a][b][c] * factors[b][a][c];
    }
  }
  return z;
}

struct FfmCase {
  bool use_cvm;
  int dense_dim;
};
void PrintTo(const FfmCase& c, std::ostream* os) {
  *os << (c.use_cvm ? "cvm" : "no cvm") << ", " << c.dense_dim << " dense features";
}

class FfmTest : public ::testing::TestWithParam<FfmCase>, protected testing::OneCard {
 protected:
  DenseModelConfig config() const {
    DenseModelConfig cfg;
    cfg.kind = ModelKind::kFfm;
    cfg.slots = 3;
    cfg.dense_dim = GetParam().dense_dim;
    cfg.mf_dim = (cfg.slots + cfg.dense_dim) * 3;  // k = 3 per field
    cfg.seed = 29;
    cfg.use_cvm = GetParam().use_cvm;
    return cfg;
  }
};

TEST_P(FfmTest, PredictionsAndGradientsMatchAFloat64Reference) {
  const DenseModelConfig cfg = config();
  DenseModel model(card_, cfg);
  // Every parameter away from its initial value, so each term is exercised.
  const std::size_t checked = testing::check_batch_sizes(
      card_, model, cfg.use_cvm * 2 + cfg.dense_dim,
      [&](const testing::HostBatch& h, int64_t i, const testing::NamedParams& p,
          const std::vector<double>& rec) { return ffm_logit(cfg, h, i, p, rec); });
  EXPECT_GT(checked, 100u);
}

// The blocks: the wide part's dense weights, the dense features' factors (D x F x k) and the
// bias; no MLP.
TEST_P(FfmTest, ShapesAndFlops) {
  const DenseModelConfig cfg = config();
  DenseModel model(card_, cfg);
  const int fields = cfg.slots + cfg.dense_dim;
  std::vector<std::string> names;
  std::size_t count = 0;
  for (const ParamBlock& b : model.parameters().blocks()) {
    names.push_back(b.name);
    count += b.count;
  }
  EXPECT_EQ(names, (std::vector<std::string>{"wide.dense_w", "ffm.dense_v", "wide.bias"}));
  EXPECT_EQ(count, static_cast<std::size_t>(cfg.dense_dim + cfg.dense_dim * fields * 3 + 1));
  EXPECT_DOUBLE_EQ(model.flops_per_example(), 2.0 * 3 * 3 * fields * (fields - 1) / 2);
}

INSTANTIATE_TEST_SUITE_P(Ffm, FfmTest,
                         ::testing::Values(FfmCase{false, 2}, FfmCase{true, 2}, FfmCase{false, 0}));

// A row width that is no whole number of factors per field is refused, naming the fields.
TEST(FfmRefusals, ARowWidthThatIsNoMultipleOfTheFieldsIsRefused) {
  device::CardSet cards = device::CardSet::from_list("0");
  cards.card(0).activate();
  DenseModelConfig cfg;
  cfg.kind = ModelKind::kFfm;
  cfg.slots = 3;
  cfg.dense_dim = 2;
  cfg.mf_dim = 8;  // 5 fields
  const std::string why = testing::refusal(cards.card(0), cfg);
  EXPECT_NE(why.find("3 sparse slots + 2 dense features = 5"), std::string::npos) << why;
}

}  // namespace
}  // namespace gpubox::trainer
