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

// The network in float64, from the parameter blocks by name (W row-major [in x out]).
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
  double at(const std::vector<double>& w, const std::string& name, std::size_t k) const {
    const ParamBlock& b = block(name);
    EXPECT_LT(k, b.count) << name;
    return w[b.offset + k];
  }
  std::vector<double> linear(const std::string& name, const std::vector<double>& x, bool relu,
                             const std::vector<double>& w) const {
    const std::size_t out = block(name + ".b").count;
    EXPECT_EQ(block(name + ".w").count, x.size() * out) << name;
    std::vector<double> y(out);
    for (std::size_t c = 0; c < out; ++c) {
      double z = at(w, name + ".b", c);
      for (std::size_t r = 0; r < x.size(); ++r) z += x[r] * at(w, name + ".w", r * out + c);
      y[c] = relu ? std::max(z, 0.0) : z;
    }
    return y;
  }
  // r_p for every pair (a < b) in itertools.combinations order, as net.py loops them.
  std::vector<double> pairs(const std::vector<std::vector<double>>& v,
                            const std::vector<double>& w) const {
    const std::size_t k = cfg.mf_dim;
    std::vector<double> r;
    for (std::size_t a = 0; a < v.size(); ++a) {
      for (std::size_t b = a + 1; b < v.size(); ++b) {
        const std::size_t base = r.size() * k * k;
        double sum = 0;
        for (std::size_t i = 0; i < k; ++i) {
          for (std::size_t j = 0; j < k; ++j) {
            const double m = at(w, "deepfefm.field_w", base + i * k + j) +
                             at(w, "deepfefm.field_w", base + j * k + i);
            sum += v[a][i] * m * v[b][j];
          }
        }
        r.push_back(sum);
      }
    }
    return r;
  }
  double logit(int64_t i, const std::vector<double>& w, const std::vector<double>& rec) const {
    const int pull = 3 + cfg.mf_dim, k = cfg.mf_dim;
    std::vector<std::vector<double>> v;
    std::vector<double> emb, dense_terms, cvm;
    double first = 0;
    for (int s = 0; s < cfg.slots; ++s) {
      std::vector<double> sum(pull, 0.0);
      for (uint32_t j = h.offsets[s * h.batch + i]; j < h.offsets[s * h.batch + i + 1]; ++j) {
        for (int c = 0; c < pull; ++c) sum[c] += rec[j * pull + c];
      }
      cvm.push_back(std::log(sum[0] + 1));
      cvm.push_back(std::log(sum[1] + 1) - std::log(sum[0] + 1));
      first += sum[2];
      v.emplace_back(sum.begin() + 3, sum.end());
      emb.insert(emb.end(), sum.begin() + 3, sum.end());
    }
    for (int d = 0; d < cfg.dense_dim; ++d) {
      const double x = h.dense[i * cfg.dense_dim + d];
      first += x * at(w, "wide.dense_w", d);
      dense_terms.push_back(x * at(w, "wide.dense_w", d));
      std::vector<double> e(k);
      for (int c = 0; c < k; ++c) e[c] = x * at(w, "deepfefm.dense_v", d * k + c);
      v.push_back(e);
    }
    const std::vector<double> r = pairs(v, w);
    double second = 0;
    for (double value : r) second += value;
    std::vector<double> x = emb;  // the DNN input
    x.insert(x.end(), dense_terms.begin(), dense_terms.end());
    x.insert(x.end(), r.begin(), r.end());
    if (cfg.use_cvm) x.insert(x.end(), cvm.begin(), cvm.end());
    for (std::size_t l = 0; l <= cfg.fc_sizes.size(); ++l) {
      x = linear("fc_" + std::to_string(l), x, l < cfg.fc_sizes.size(), w);
    }
    return first + second + x.at(0);
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

class DeepFefmTest : public ::testing::TestWithParam<bool> {
 protected:
  DeepFefmTest() : cards_(device::CardSet::from_list("0")), card_(cards_.card(0)) {
    card_.activate();
  }
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
  device::CardSet cards_;
  device::Card& card_;
};

TEST_P(DeepFefmTest, PredictionsAndGradientsMatchAFloat64Reference) {
  const DenseModelConfig cfg = config();
  DenseModel model(card_, cfg);
  std::mt19937_64 rng(cfg.use_cvm ? 61 : 62);
  const HostBatch h = make_batch(6, cfg, rng);
  // Every parameter random (the zero-started ones too: wide.dense_w, the biases), so that each
  // term moves the loss.
  std::vector<float> w = model.parameters().values_to_host();
  std::uniform_real_distribution<float> value(-0.5f, 0.5f);
  for (const ParamBlock& b : model.parameters().blocks()) {
    for (std::size_t k = 0; k < b.count; ++k) w[b.offset + k] = value(rng);
  }
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
  for (const ParamBlock& b : model.parameters().blocks()) {
    for (std::size_t k = 0; k < b.count; ++k) {
      EXPECT_NEAR(grads[b.offset + k] * n, central(wd, b.offset + k, loss_of),
                  1e-4 + 1e-3 * std::fabs(grads[b.offset + k] * n))
          << b.name << "[" << k << "]";
    }
  }
  const int pull = model.pool().pull_dim();
  for (std::size_t j = 0; j < h.offsets.back(); ++j) {
    for (int k = 2; k < pull; ++k) {  // embed_w and embedx_w; show and click are counters
      EXPECT_NEAR(pushed[j * pull + k], central(rec, j * pull + k, loss_of),
                  1e-4 + 1e-3 * std::fabs(pushed[j * pull + k]))
          << "occurrence " << j << " field " << k;
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
  try {
    DenseModel model(card_, cfg);
    FAIL() << "slots of several widths were accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("hyper_parameters.slot_dims"), std::string::npos)
        << e.what();
  }
}

// bf16 asked for: the FEFM computes in fp32, so the whole dense net does (said at start).
TEST_P(DeepFefmTest, Bf16RunsInFp32) {
  DenseModelConfig cfg = config();
  cfg.precision = DensePrecision::kBf16;
  DenseModel model(card_, cfg);
  EXPECT_EQ(model.precision(), DensePrecision::kFp32);
}

INSTANTIATE_TEST_SUITE_P(Cvm, DeepFefmTest, ::testing::Bool());

}  // namespace
}  // namespace gpubox::trainer
