// dlrm (DlrmPart, dot_interaction.cu) against a float64 reference written from the network's
// definition (PaddleRec's models/rank/dlrm net.py: bottom MLP, the upper triangle of the
// products among the slots' embeddings and the bottom output, the top MLP over both): its
// predictions, and every gradient (dense parameters and pulled values) against central
// differences of the reference's summed log loss; its shapes and flops; its refusals; bf16 near
// fp32.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
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
  // y = act(x W + b) for the layer `name`.
  std::vector<double> linear(const std::string& name, const std::vector<double>& x, bool relu,
                             const std::vector<double>& w) const {
    const ParamBlock& wb = block(name + ".w");
    const ParamBlock& bb = block(name + ".b");
    const std::size_t out = bb.count;
    EXPECT_EQ(wb.count, x.size() * out) << name;
    std::vector<double> y(out);
    for (std::size_t c = 0; c < out; ++c) {
      double z = w[bb.offset + c];
      for (std::size_t r = 0; r < x.size(); ++r) z += x[r] * w[wb.offset + r * out + c];
      y[c] = relu ? std::max(z, 0.0) : z;
    }
    return y;
  }
  // Instance i's logit.
  double logit(int64_t i, const std::vector<double>& w, const std::vector<double>& rec) const {
    const int pull = 3 + cfg.mf_dim, d = 1 + cfg.mf_dim;
    std::vector<double> x(h.dense.begin() + i * cfg.dense_dim,
                          h.dense.begin() + (i + 1) * cfg.dense_dim);
    for (std::size_t l = 0; l < cfg.bot_layer_sizes.size(); ++l) {
      x = linear("bot_" + std::to_string(l), x, true, w);
    }
    std::vector<std::vector<double>> t;
    std::vector<double> cvm;
    for (int s = 0; s < cfg.slots; ++s) {
      std::vector<double> sum(pull, 0.0);
      for (uint32_t j = h.offsets[s * h.batch + i]; j < h.offsets[s * h.batch + i + 1]; ++j) {
        for (int k = 0; k < pull; ++k) sum[k] += rec[j * pull + k];
      }
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
      r = linear("fc_" + std::to_string(l), r, l < cfg.fc_sizes.size(), w);
    }
    return r.at(0);
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

class DenseModelFlops : public ::testing::Test {
 protected:
  DenseModelFlops() : cards_(device::CardSet::from_list("0")), card_(cards_.card(0)) {
    card_.activate();
  }
  device::CardSet cards_;
  device::Card& card_;
};

class DlrmTest : public ::testing::TestWithParam<bool> {
 protected:
  DlrmTest() : cards_(device::CardSet::from_list("0")), card_(cards_.card(0)) { card_.activate(); }
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
  device::CardSet cards_;
  device::Card& card_;
};

TEST_P(DlrmTest, PredictionsAndGradientsMatchAFloat64Reference) {
  const DenseModelConfig cfg = config();
  DenseModel model(card_, cfg);
  std::mt19937_64 rng(cfg.use_cvm ? 41 : 42);
  const HostBatch h = make_batch(6, cfg, rng);
  // Biases away from zero keep the ReLUs off their kinks, where differences mean nothing.
  std::vector<float> w = model.parameters().values_to_host();
  for (const ParamBlock& b : model.parameters().blocks()) {
    if (b.name.back() != 'b') continue;
    for (std::size_t k = 0; k < b.count; ++k) w[b.offset + k] = (k % 2 ? -0.15f : 0.2f);
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
  try {
    DenseModel model(card_, cfg);
    FAIL() << "a bottom output narrower than the embeddings was accepted";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("the last of hyper_parameters.bot_layer_sizes: 3"), std::string::npos)
        << what;
    EXPECT_NE(what.find("hyper_parameters.sparse_feature_dim: 4"), std::string::npos) << what;
  }
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
  DenseModelConfig cfg = config();
  DenseModel fp32(card_, cfg);
  cfg.precision = DensePrecision::kBf16;
  setenv("GPUBOX_BF16_EMULATION", "1", 1);
  DenseModel bf16(card_, cfg);
  unsetenv("GPUBOX_BF16_EMULATION");
  ASSERT_EQ(bf16.precision(), DensePrecision::kBf16);
  bf16.parameters().set_values(fp32.parameters().values_to_host());
  std::mt19937_64 rng(7);
  const HostBatch h = make_batch(64, cfg, rng);
  auto records = to_device(h.records, card_.memory(), card_.stream());
  auto offsets = to_device(h.offsets, card_.memory(), card_.stream());
  auto dense = to_device(h.dense, card_.memory(), card_.stream());
  auto labels = to_device(h.labels, card_.memory(), card_.stream());
  const DenseBatchView view{SlotBatchView{records.data(), offsets.data(), h.batch, cfg.slots},
                            dense.data(), labels.data(), h.batch};
  struct Out {
    std::vector<float> preds, grads, push;
  };
  auto run = [&](DenseModel& model) {
    auto push = card_.make_buffer<float>(h.offsets.back() * model.pool().push_dim());
    model.forward_backward(view, GradScales{1.0f / 64, 1.0f}, push.data());
    return Out{to_host(model.predictions(), h.batch, card_.stream()),
               model.parameters().grads_to_host(), to_host(push)};
  };
  const Out want = run(fp32), got = run(bf16);
  for (int64_t i = 0; i < h.batch; ++i) EXPECT_NEAR(got.preds[i], want.preds[i], 2e-2) << i;
  auto relative_error = [](const std::vector<float>& a, const std::vector<float>& b) {
    double diff = 0, norm = 0;
    for (std::size_t k = 0; k < b.size(); ++k) {
      diff += (a[k] - b[k]) * static_cast<double>(a[k] - b[k]);
      norm += b[k] * static_cast<double>(b[k]);
    }
    return std::sqrt(diff / norm);
  };
  ASSERT_EQ(got.grads.size(), want.grads.size());
  EXPECT_LT(relative_error(got.grads, want.grads), 0.05);
  EXPECT_LT(relative_error(got.push, want.push), 0.05);
}

INSTANTIATE_TEST_SUITE_P(Cvm, DlrmTest, ::testing::Bool());

}  // namespace
}  // namespace gpubox::trainer
