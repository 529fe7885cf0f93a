// xdeepfm (XdeepfmPart, cin.cu) against a float64 reference written from the network's
// definition (PaddleRec's models/rank/xdeepfm net.py: the first-order term, the fields' embeddings
// with the dense features' x_i e_i, the CIN's layers X^{k+1}[o, d] = sum W[f, h, o] X^0[f, d]
// X^k[h, d] summed over d into the logit, the DNN over the fields): its predictions, and every
// gradient (dense parameters and pulled values) against central differences of the reference's
// summed log loss; its shapes and flops (PaddleRec's config.yaml by hand); its refusals.
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

using Matrix = std::vector<std::vector<double>>;  // [rows][D]

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
  // The CIN's term from the fields X^0.
  double cin(const Matrix& x0, const std::vector<double>& w) const {
    const std::size_t fields = x0.size(), width = cfg.mf_dim;
    Matrix xk = x0;
    std::vector<double> p;
    for (std::size_t k = 0; k < cfg.cin_layer_sizes.size(); ++k) {
      const std::size_t out = cfg.cin_layer_sizes[k], height = xk.size();
      const std::string name = "cin_" + std::to_string(k) + ".w";
      Matrix next(out, std::vector<double>(width, 0.0));
      for (std::size_t o = 0; o < out; ++o) {
        for (std::size_t d = 0; d < width; ++d) {
          for (std::size_t f = 0; f < fields; ++f) {
            for (std::size_t hh = 0; hh < height; ++hh) {
              next[o][d] += at(w, name, (f * height + hh) * out + o) * x0[f][d] * xk[hh][d];
            }
          }
        }
        double sum = 0;
        for (std::size_t d = 0; d < width; ++d) sum += next[o][d];
        p.push_back(sum);
      }
      xk = next;
    }
    double term = 0;
    for (std::size_t j = 0; j < p.size(); ++j) term += p[j] * at(w, "cin_out.w", j);
    return term;
  }
  double logit(int64_t i, const std::vector<double>& w, const std::vector<double>& rec) const {
    const int pull = 3 + cfg.mf_dim, width = cfg.mf_dim;
    Matrix x0;
    std::vector<double> cvm;
    double wide = 0;
    for (int s = 0; s < cfg.slots; ++s) {
      std::vector<double> sum(pull, 0.0);
      for (uint32_t j = h.offsets[s * h.batch + i]; j < h.offsets[s * h.batch + i + 1]; ++j) {
        for (int k = 0; k < pull; ++k) sum[k] += rec[j * pull + k];
      }
      cvm.push_back(std::log(sum[0] + 1));
      cvm.push_back(std::log(sum[1] + 1) - std::log(sum[0] + 1));
      wide += sum[2];
      x0.emplace_back(sum.begin() + 3, sum.end());
    }
    for (int f = 0; f < cfg.dense_dim; ++f) {
      const double x = h.dense[i * cfg.dense_dim + f];
      wide += x * at(w, "wide.dense_w", f);
      std::vector<double> e(width);
      for (int d = 0; d < width; ++d) e[d] = x * at(w, "xdeepfm.dense_w", f * width + d);
      x0.push_back(e);
    }
    std::vector<double> r;  // the DNN input: column d F + f, then the cvm features
    for (int d = 0; d < width; ++d) {
      for (const auto& field : x0) r.push_back(field[d]);
    }
    if (cfg.use_cvm) r.insert(r.end(), cvm.begin(), cvm.end());
    for (std::size_t l = 0; l <= cfg.fc_sizes.size(); ++l) {
      r = linear("fc_" + std::to_string(l), r, l < cfg.fc_sizes.size(), w);
    }
    return r.at(0) + cin(x0, w) + wide;
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

class XdeepfmTest : public ::testing::TestWithParam<bool> {
 protected:
  XdeepfmTest() : cards_(device::CardSet::from_list("0")), card_(cards_.card(0)) {
    card_.activate();
  }
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
  device::CardSet cards_;
  device::Card& card_;
};

TEST_P(XdeepfmTest, PredictionsAndGradientsMatchAFloat64Reference) {
  const DenseModelConfig cfg = config();
  DenseModel model(card_, cfg);
  std::mt19937_64 rng(cfg.use_cvm ? 51 : 52);
  const HostBatch h = make_batch(6, cfg, rng);
  // Every parameter random (the zero-started ones too: wide.dense_w, the biases), so that each
  // term moves the loss; the dense embeddings start at 1 (PaddleRec's), checked first.
  std::vector<float> w = model.parameters().values_to_host();
  std::uniform_real_distribution<float> value(-0.5f, 0.5f);
  for (const ParamBlock& b : model.parameters().blocks()) {
    for (std::size_t k = 0; k < b.count; ++k) {
      if (b.name == "xdeepfm.dense_w") {
        EXPECT_EQ(w[b.offset + k], 1.0f) << k;
      }
      w[b.offset + k] = value(rng);
    }
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
  try {
    DenseModel model(card_, cfg);
    FAIL() << "slots of several widths were accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("hyper_parameters.slot_dims"), std::string::npos)
        << e.what();
  }
  cfg = config();
  cfg.cin_layer_sizes = {};
  EXPECT_THROW(DenseModel(card_, cfg), Error);
}

// bf16 asked for: the CIN computes in fp32, so the whole dense net does (said at start).
TEST_P(XdeepfmTest, Bf16RunsInFp32) {
  DenseModelConfig cfg = config();
  cfg.precision = DensePrecision::kBf16;
  DenseModel model(card_, cfg);
  EXPECT_EQ(model.precision(), DensePrecision::kFp32);
}

INSTANTIATE_TEST_SUITE_P(Cvm, XdeepfmTest, ::testing::Bool());

}  // namespace
}  // namespace gpubox::trainer
