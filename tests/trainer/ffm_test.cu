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

#include "common/error.hpp"
#include "heterps/device/card.hpp"
#include "tests/heterps/device/test_cards.hpp"
#include "trainer/nn/dense_model.hpp"

namespace gpubox::trainer {
namespace {
using device::to_device;
using device::to_host;

struct HostBatch {
  std::vector<float> records;  // show, click, embed_w, embedx_w[mf_dim] per occurrence
  std::vector<uint32_t> offsets;
  std::vector<float> dense;
  std::vector<float> labels;
  int64_t batch = 0;
};

HostBatch make_batch(int64_t batch, const DenseModelConfig& cfg, std::mt19937_64& rng) {
  HostBatch h;
  h.batch = batch;
  h.offsets.push_back(0);
  std::uniform_int_distribution<int> count(0, 2), shows(0, 4);
  std::uniform_real_distribution<float> value(-0.6f, 0.6f);
  for (int s = 0; s < cfg.slots; ++s) {
    for (int64_t i = 0; i < batch; ++i) {
      const int n = count(rng);
      for (int j = 0; j < n; ++j) {
        const int show = shows(rng);
        h.records.push_back(static_cast<float>(show));
        h.records.push_back(static_cast<float>(std::uniform_int_distribution<int>(0, show)(rng)));
        for (int k = 0; k < 1 + cfg.mf_dim; ++k) h.records.push_back(value(rng));
      }
      h.offsets.push_back(h.offsets.back() + n);
    }
  }
  for (int64_t i = 0; i < batch * cfg.dense_dim; ++i) h.dense.push_back(2 * value(rng));
  for (int64_t i = 0; i < batch; ++i) h.labels.push_back(static_cast<float>(rng() % 2));
  return h;
}

// The network in float64, from the parameter blocks by name.
struct Reference {
  const DenseModelConfig& cfg;
  const std::vector<ParamBlock>& blocks;
  const HostBatch& h;

  const ParamBlock& block(const std::string& name) const {
    for (const ParamBlock& b : blocks) {
      if (b.name == name) return b;
    }
    throw std::runtime_error("no parameter block " + name);
  }
  double logit(int64_t i, const std::vector<double>& w, const std::vector<double>& rec) const {
    const int pull = 3 + cfg.mf_dim, fields = cfg.slots + cfg.dense_dim;
    const int k = cfg.mf_dim / fields;
    const ParamBlock& dense_w = block("wide.dense_w");
    const ParamBlock& dense_v = block("ffm.dense_v");
    double z = w[block("wide.bias").offset];
    // factors[a][b]: field a's factor toward field b.
    std::vector<std::vector<std::vector<double>>> factors(
        fields, std::vector<std::vector<double>>(fields, std::vector<double>(k)));
    for (int s = 0; s < cfg.slots; ++s) {
      std::vector<double> sum(pull, 0.0);
      for (uint32_t j = h.offsets[s * h.batch + i]; j < h.offsets[s * h.batch + i + 1]; ++j) {
        for (int c = 0; c < pull; ++c) sum[c] += rec[j * pull + c];
      }
      z += sum[2];  // embed_w: the first-order weight
      for (int b = 0; b < fields; ++b) {
        for (int c = 0; c < k; ++c) factors[s][b][c] = sum[3 + b * k + c];
      }
    }
    for (int d = 0; d < cfg.dense_dim; ++d) {
      const double x = h.dense[i * cfg.dense_dim + d];
      z += x * w[dense_w.offset + d];
      for (int b = 0; b < fields; ++b) {
        for (int c = 0; c < k; ++c) {
          factors[cfg.slots + d][b][c] = x * w[dense_v.offset + (d * fields + b) * k + c];
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
  double summed_loss(const std::vector<double>& w, const std::vector<double>& rec) const {
    double loss = 0;
    for (int64_t i = 0; i < h.batch; ++i) {
      const double z = logit(i, w, rec), y = h.labels[i];
      loss += std::max(z, 0.0) - y * z + std::log1p(std::exp(-std::fabs(z)));
    }
    return loss;
  }
};

double central(std::vector<double>& v, std::size_t k, const std::function<double()>& f) {
  const double saved = v[k], eps = 1e-6;
  v[k] = saved + eps;
  const double plus = f();
  v[k] = saved - eps;
  const double minus = f();
  v[k] = saved;
  return (plus - minus) / (2 * eps);
}

struct FfmCase {
  bool use_cvm;
  int dense_dim;
};
void PrintTo(const FfmCase& c, std::ostream* os) {
  *os << (c.use_cvm ? "cvm" : "no cvm") << ", " << c.dense_dim << " dense features";
}

class FfmTest : public ::testing::TestWithParam<FfmCase> {
 protected:
  FfmTest() : cards_(device::CardSet::from_list("0")), card_(cards_.card(0)) { card_.activate(); }
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
  device::CardSet cards_;
  device::Card& card_;
};

TEST_P(FfmTest, PredictionsAndGradientsMatchAFloat64Reference) {
  const DenseModelConfig cfg = config();
  DenseModel model(card_, cfg);
  std::mt19937_64 rng(cfg.use_cvm * 2 + cfg.dense_dim);
  const HostBatch h = make_batch(6, cfg, rng);
  // Every parameter away from its initial value, so each term is exercised.
  std::vector<float> w = model.parameters().values_to_host();
  std::uniform_real_distribution<float> value(-0.5f, 0.5f);
  for (float& v : w) v = value(rng);
  model.parameters().set_values(w);
  auto records = to_device(h.records, card_.memory(), card_.stream());
  auto offsets = to_device(h.offsets, card_.memory(), card_.stream());
  auto dense = to_device(h.dense, card_.memory(), card_.stream());
  auto labels = to_device(h.labels, card_.memory(), card_.stream());
  const DenseBatchView view{SlotBatchView{records.data(), offsets.data(), h.batch, cfg.slots},
                            dense.data(), labels.data(), h.batch};
  auto push = card_.make_buffer<float>(h.offsets.back() * model.pool().push_dim());
  const double n = static_cast<double>(h.batch);
  const double loss = model.forward_backward(view, GradScales{1.0f / 6, 1.0f}, push.data());
  const std::vector<float> preds = to_host(model.predictions(), h.batch, card_.stream());
  const std::vector<float> grads = model.parameters().grads_to_host();
  const std::vector<float> pushed = to_host(push);

  const Reference ref{cfg, model.parameters().blocks(), h};
  std::vector<double> wd(w.begin(), w.end()), rec(h.records.begin(), h.records.end());
  EXPECT_NEAR(loss, ref.summed_loss(wd, rec), 1e-5 * loss);
  for (int64_t i = 0; i < h.batch; ++i) {
    EXPECT_NEAR(preds[i], 1 / (1 + std::exp(-ref.logit(i, wd, rec))), 1e-5) << "instance " << i;
  }
  const auto loss_of = [&] { return ref.summed_loss(wd, rec); };
  std::size_t checked = 0;
  for (const ParamBlock& b : model.parameters().blocks()) {
    for (std::size_t k = 0; k < b.count; ++k, ++checked) {
      EXPECT_NEAR(grads[b.offset + k] * n, central(wd, b.offset + k, loss_of),
                  1e-4 + 1e-3 * std::fabs(grads[b.offset + k] * n))
          << b.name << "[" << k << "]";
    }
  }
  const int pull = model.pool().pull_dim();
  for (std::size_t j = 0; j < h.offsets.back(); ++j) {
    for (int k = 2; k < pull; ++k, ++checked) {  // embed_w and embedx_w; show, click: counters
      EXPECT_NEAR(pushed[j * pull + k], central(rec, j * pull + k, loss_of),
                  1e-4 + 1e-3 * std::fabs(pushed[j * pull + k]))
          << "occurrence " << j << " field " << k;
    }
  }
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
  try {
    DenseModel model(cards.card(0), cfg);
    FAIL() << "an ffm row of 8 values over 5 fields was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("3 sparse slots + 2 dense features = 5"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace gpubox::trainer
