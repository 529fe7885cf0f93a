// The MLPs with hyper_parameters.dnn_batch_norm (DenseModelConfig::batch_norm): dlrm as PaddleRec
// builds it (Linear -> ReLU -> BatchNorm1D after every bottom layer and every top hidden layer)
// and the dnn, against a float64 reference of the whole batch (the norms couple its instances):
// the loss, the predictions, every trained gradient and every pushed gradient against central
// differences; predict with the running statistics; the optimizer moving them as Paddle does;
// bf16 near fp32; and a model without the key keeping the layout it had.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "heterps/device/card.hpp"
#include "tests/heterps/device/test_cards.hpp"
#include "tests/trainer/field_model_check.hpp"
#include "trainer/nn/dense_model.hpp"
#include "trainer/nn/dense_optimizer.hpp"

namespace gpubox::trainer {
namespace {

using Rows = std::vector<std::vector<double>>;
using testing::HostBatch;
using testing::NamedParams;

// The norm `name` over the rows: the batch's biased statistics (training), else the running ones.
Rows batch_norm(const NamedParams& p, const std::string& name, const Rows& x, bool training) {
  const std::size_t cols = x.at(0).size();
  Rows y = x;
  for (std::size_t j = 0; j < cols; ++j) {
    double mean = p(name + ".running_mean", j), var = p(name + ".running_var", j);
    if (training) {
      mean = var = 0;
      for (const auto& row : x) mean += row[j] / static_cast<double>(x.size());
      for (const auto& row : x) var += (row[j] - mean) * (row[j] - mean) / x.size();
    }
    for (std::size_t i = 0; i < x.size(); ++i) {
      y[i][j] =
          p(name + ".gamma", j) * (x[i][j] - mean) / std::sqrt(var + 1e-5) + p(name + ".beta", j);
    }
  }
  return y;
}

// fc_0 .. fc_L over the rows, a norm after every hidden layer's ReLU (with cfg.batch_norm); the
// outputs: one logit per row, or with DlrmOutput::kSoftmax2 the last layer's two values, ReLU'd
// and normalised like a hidden layer's (PaddleRec's MLPLayer).
// `last_norm_input` (when set): the last norm's input, the ReLU output it normalises.
Rows top_mlp(const DenseModelConfig& cfg, const NamedParams& p, Rows r, bool training,
             Rows* last_norm_input) {
  const bool two_class = cfg.dlrm_output == DlrmOutput::kSoftmax2;
  for (std::size_t l = 0; l <= cfg.fc_sizes.size(); ++l) {
    const bool hidden = l < cfg.fc_sizes.size() || two_class;
    for (auto& row : r) row = p.linear("fc_" + std::to_string(l), row, hidden);
    if (!hidden || !cfg.batch_norm) continue;
    if (last_norm_input != nullptr) *last_norm_input = r;
    r = batch_norm(p, "fc_" + std::to_string(l) + ".bn", r, training);
  }
  for (const auto& row : r) EXPECT_EQ(row.size(), two_class ? 2u : 1u);
  return r;
}

// One instance's loss from its outputs: the log loss of the logit, or the cross entropy of the
// two-class softmax, -log softmax(u)[y] = logsumexp(u) - u_y.
double loss_of_outputs(const std::vector<double>& out, float label) {
  if (out.size() == 1) {
    const double z = out[0];
    return std::max(z, 0.0) - label * z + std::log1p(std::exp(-std::fabs(z)));
  }
  const double top = std::max(out[0], out[1]);
  const double lse = top + std::log(std::exp(out[0] - top) + std::exp(out[1] - top));
  return lse - out[label > 0.5f ? 1 : 0];
}
// The prediction: sigmoid of the logit, or softmax(u)[1].
double prediction_of(const std::vector<double>& out) {
  if (out.size() == 1) return 1 / (1 + std::exp(-out[0]));
  return 1 / (1 + std::exp(out[0] - out[1]));
}

// dlrm's outputs (the reference of dlrm_test.cu with PaddleRec's norms).
Rows dlrm_logits(const DenseModelConfig& cfg, const HostBatch& h, const NamedParams& p,
                 const std::vector<double>& rec, bool training, Rows* last_norm_input) {
  Rows x;
  for (int64_t i = 0; i < h.batch; ++i) {
    x.emplace_back(h.dense.begin() + i * cfg.dense_dim, h.dense.begin() + (i + 1) * cfg.dense_dim);
  }
  for (std::size_t l = 0; l < cfg.bot_layer_sizes.size(); ++l) {
    const std::string name = "bot_" + std::to_string(l);
    for (auto& row : x) row = p.linear(name, row, true);
    if (cfg.batch_norm) x = batch_norm(p, name + ".bn", x, training);
  }
  Rows r;
  for (int64_t i = 0; i < h.batch; ++i) {
    Rows t;
    for (const std::vector<double>& sum : testing::pooled_slots(h, cfg, i, rec)) {
      t.emplace_back(sum.begin() + 2, sum.end());
    }
    t.push_back(x[i]);
    std::vector<double> row = x[i];
    for (std::size_t a = 0; a < t.size(); ++a) {
      for (std::size_t b = a + 1; b < t.size(); ++b) {
        double dot = 0;
        for (std::size_t k = 0; k < t[a].size(); ++k) dot += t[a][k] * t[b][k];
        row.push_back(dot);
      }
    }
    r.push_back(row);
  }
  return top_mlp(cfg, p, r, training, last_norm_input);
}

// The dnn's logits: [pooled embed_w, embedx of every slot | dense] through the MLP.
Rows dnn_logits(const DenseModelConfig& cfg, const HostBatch& h, const NamedParams& p,
                const std::vector<double>& rec, bool training, Rows* last_norm_input) {
  Rows r;
  for (int64_t i = 0; i < h.batch; ++i) {
    std::vector<double> row;
    for (const std::vector<double>& sum : testing::pooled_slots(h, cfg, i, rec)) {
      row.insert(row.end(), sum.begin() + 2, sum.end());
    }
    row.insert(row.end(), h.dense.begin() + i * cfg.dense_dim,
               h.dense.begin() + (i + 1) * cfg.dense_dim);
    r.push_back(row);
  }
  return top_mlp(cfg, p, r, training, last_norm_input);
}

using BatchLogits = Rows (*)(const DenseModelConfig&, const HostBatch&, const NamedParams&,
                             const std::vector<double>&, bool, Rows*);

// A network and its output layer; dlrm's two-class output with and without the norms.
struct Net {
  const char* name;
  ModelKind kind;
  BatchLogits logits;
  DlrmOutput output = DlrmOutput::kLogit;
  bool batch_norm = true;
};
void PrintTo(const Net& net, std::ostream* out) { *out << net.name; }

class BatchNormModelTest : public ::testing::TestWithParam<Net> {
 protected:
  BatchNormModelTest() : cards_(device::CardSet::from_list("0")), card_(cards_.card(0)) {
    card_.activate();
  }
  DenseModelConfig config() const {
    DenseModelConfig cfg;
    cfg.kind = GetParam().kind;
    cfg.slots = 3;
    cfg.mf_dim = 3;
    cfg.dense_dim = 2;
    cfg.bot_layer_sizes = {5, 4};
    cfg.fc_sizes = {6, 3};
    cfg.seed = 23;
    cfg.batch_norm = GetParam().batch_norm;
    cfg.dlrm_output = GetParam().output;
    return cfg;
  }
  // Sets the trained blocks random in [-0.5, 0.5] (gamma near 1), the statistics plausible.
  static std::vector<float> randomize(DenseModel& model, std::mt19937_64& rng) {
    std::vector<float> w = model.parameters().values_to_host();
    std::uniform_real_distribution<float> value(-0.5f, 0.5f);
    for (const ParamBlock& b : model.parameters().blocks()) {
      const bool gamma = b.name.find(".gamma") != std::string::npos;
      const bool var = b.name.find(".running_var") != std::string::npos;
      for (std::size_t k = 0; k < b.count; ++k) {
        w[b.offset + k] = value(rng) + (gamma ? 1.0f : 0.0f) + (var ? 1.0f : 0.0f);
      }
    }
    model.parameters().set_values(w);
    return w;
  }
  device::CardSet cards_;
  device::Card& card_;
};

// One forward_backward of `batch` instances against the reference: loss, predictions, every
// trained gradient and every pushed gradient; the statistics' slots hold their change.
TEST_P(BatchNormModelTest, GradientsMatchAFloat64Reference) {
  const DenseModelConfig cfg = config();
  DenseModel model(card_, cfg);
  for (const int64_t batch : {6, 1, 9}) {
    SCOPED_TRACE("batch " + std::to_string(batch));
    std::mt19937_64 rng(31 + batch);
    const HostBatch h = testing::make_field_batch(batch, cfg, rng);
    const std::vector<float> w = randomize(model, rng);
    const testing::CardBatch on_card(card_, h, cfg.slots);
    auto push = card_.make_buffer<float>(h.offsets.back() * model.pool().push_dim());
    const float scale = 1.0f / static_cast<float>(batch);
    const double loss = model.forward_backward(on_card.view, GradScales{scale, 1.0f}, push.data());
    const std::vector<float> preds = device::to_host(model.predictions(), batch, card_.stream());
    const std::vector<float> grads = model.parameters().grads_to_host();
    const std::vector<float> pushed = device::to_host(push);

    std::vector<double> wd(w.begin(), w.end()), rec(h.records.begin(), h.records.end());
    const NamedParams params{model.parameters().blocks(), wd};
    const auto loss_of = [&] {
      const Rows z = GetParam().logits(cfg, h, params, rec, true, nullptr);
      double sum = 0;
      for (int64_t i = 0; i < batch; ++i) sum += loss_of_outputs(z[i], h.labels[i]);
      return sum;
    };
    EXPECT_NEAR(loss, loss_of(), 1e-5 * loss + 1e-6);
    const Rows z = GetParam().logits(cfg, h, params, rec, true, nullptr);
    for (int64_t i = 0; i < batch; ++i) EXPECT_NEAR(preds[i], prediction_of(z[i]), 1e-5);
    std::size_t checked = 0;
    for (const ParamBlock& b : model.parameters().blocks()) {
      if (b.statistic) continue;  // its slot holds the change: OptimizerMovesTheRunningStatistics
      for (std::size_t k = 0; k < b.count; ++k, ++checked) {
        const double g = grads[b.offset + k] * static_cast<double>(batch);
        EXPECT_NEAR(g, testing::central(wd, b.offset + k, loss_of), 2e-4 + 2e-3 * std::fabs(g))
            << b.name << "[" << k << "]";
      }
    }
    const int pull = model.pool().pull_dim();
    for (std::size_t j = 0; j < h.offsets.back(); ++j) {
      for (int k = 2; k < pull; ++k, ++checked) {
        const double g = pushed[j * pull + k];
        EXPECT_NEAR(g, testing::central(rec, j * pull + k, loss_of), 2e-4 + 2e-3 * std::fabs(g))
            << "occurrence " << j << " field " << k;
      }
    }
    EXPECT_GT(checked, 100u);
  }
}

// predict normalises by the running statistics (set apart from any batch's).
TEST_P(BatchNormModelTest, PredictUsesTheRunningStatistics) {
  if (!GetParam().batch_norm) GTEST_SKIP() << "no norms";
  const DenseModelConfig cfg = config();
  DenseModel model(card_, cfg);
  std::mt19937_64 rng(8);
  const std::vector<float> w = randomize(model, rng);
  const HostBatch h = testing::make_field_batch(7, cfg, rng);
  const testing::CardBatch on_card(card_, h, cfg.slots);
  model.predict(on_card.view);
  const std::vector<float> preds = device::to_host(model.predictions(), h.batch, card_.stream());
  std::vector<double> wd(w.begin(), w.end()), rec(h.records.begin(), h.records.end());
  const NamedParams params{model.parameters().blocks(), wd};
  const Rows infer = GetParam().logits(cfg, h, params, rec, false, nullptr);
  const Rows train = GetParam().logits(cfg, h, params, rec, true, nullptr);
  double apart = 0;
  for (int64_t i = 0; i < h.batch; ++i) {
    EXPECT_NEAR(preds[i], prediction_of(infer[i]), 1e-5) << i;
    apart = std::max(apart, std::fabs(prediction_of(infer[i]) - prediction_of(train[i])));
  }
  EXPECT_GT(apart, 1e-2) << "the batch's statistics would have given the same predictions";
}

// One SGD step on one card with the dense scale 1/batch: the running statistics become
// 0.9 running + 0.1 batch statistic (Paddle's update), gamma and beta move by the rule.
TEST_P(BatchNormModelTest, OptimizerMovesTheRunningStatistics) {
  if (!GetParam().batch_norm) GTEST_SKIP() << "no norms";
  const DenseModelConfig cfg = config();
  DenseModel model(card_, cfg);
  DenseOptimizerConfig opt_cfg;
  opt_cfg.kind = DenseOptimizerKind::kSgd;
  opt_cfg.learning_rate = 0.5f;
  DenseOptimizer opt(card_, opt_cfg, model.parameters().size());
  std::mt19937_64 rng(9);
  const std::vector<float> before = randomize(model, rng);
  const HostBatch h = testing::make_field_batch(8, cfg, rng);
  const testing::CardBatch on_card(card_, h, cfg.slots);
  auto push = card_.make_buffer<float>(h.offsets.back() * model.pool().push_dim());
  model.forward_backward(on_card.view, GradScales{1.0f / 8, 1.0f}, push.data());
  const std::vector<float> grads = model.parameters().grads_to_host();
  opt.step(model.parameters());
  const std::vector<float> after = model.parameters().values_to_host();
  // The first norm's input is the first layer's ReLU output, computed here from the reference.
  std::vector<double> wd(before.begin(), before.end()), rec(h.records.begin(), h.records.end());
  const NamedParams params{model.parameters().blocks(), wd};
  const bool dlrm = cfg.kind == ModelKind::kDlrm;
  const std::string first = dlrm ? "bot_0" : "fc_0";
  Rows x;
  for (int64_t i = 0; i < h.batch; ++i) {
    std::vector<double> in;
    if (!dlrm) {
      for (const std::vector<double>& sum : testing::pooled_slots(h, cfg, i, rec)) {
        in.insert(in.end(), sum.begin() + 2, sum.end());
      }
    }
    in.insert(in.end(), h.dense.begin() + i * cfg.dense_dim,
              h.dense.begin() + (i + 1) * cfg.dense_dim);
    x.push_back(params.linear(first, in, true));
  }
  // The norm `name`'s running statistics moved toward the batch's statistics of its input x.
  const auto expect_moved = [&](const std::string& name, const Rows& in) {
    const ParamBlock& mean = params.block(name + ".running_mean");
    const ParamBlock& var = params.block(name + ".running_var");
    ASSERT_EQ(mean.count, in.at(0).size()) << name;
    for (std::size_t j = 0; j < mean.count; ++j) {
      double m = 0, v = 0;
      for (const auto& row : in) m += row[j] / static_cast<double>(in.size());
      for (const auto& row : in) v += (row[j] - m) * (row[j] - m) / in.size();
      EXPECT_NEAR(after[mean.offset + j], 0.9 * before[mean.offset + j] + 0.1 * m, 1e-5)
          << name << " " << j;
      EXPECT_NEAR(after[var.offset + j], 0.9 * before[var.offset + j] + 0.1 * v, 1e-5)
          << name << " " << j;
    }
  };
  expect_moved(first + ".bn", x);
  // The top MLP's last norm (the two-class output's own), from the reference's input to it.
  Rows last;
  GetParam().logits(cfg, h, params, rec, true, &last);
  const std::size_t top = cfg.fc_sizes.size() - (cfg.dlrm_output == DlrmOutput::kSoftmax2 ? 0 : 1);
  expect_moved("fc_" + std::to_string(top) + ".bn", last);
  const ParamBlock& gamma = params.block(first + ".bn.gamma");
  for (std::size_t j = 0; j < gamma.count; ++j) {
    const std::size_t k = gamma.offset + j;
    EXPECT_FLOAT_EQ(after[k], before[k] - 0.5f * grads[k]);
  }
}

// bf16 (emulated where the CPU has none): the norms read and write bf16 rows, their sums and
// statistics fp32; predictions and gradients within bf16's rounding of fp32.
TEST_P(BatchNormModelTest, Bf16StaysNearFp32) {
  // The two-class output's norm divides its 2-wide ReLU layer's outputs by their batch's spread,
  // which magnifies what bf16 rounded before it (the logit layer's output is not normalised).
  const bool two_class = GetParam().output == DlrmOutput::kSoftmax2 && GetParam().batch_norm;
  testing::expect_bf16_near_fp32(card_, config(), 7, 0.06, two_class ? 0.1 : 0.06, 64,
                                 two_class ? 4e-2 : 2e-2);
}

INSTANTIATE_TEST_SUITE_P(Nets, BatchNormModelTest,
                         ::testing::Values(Net{"dlrm", ModelKind::kDlrm, dlrm_logits},
                                           Net{"dnn", ModelKind::kDnn, dnn_logits},
                                           Net{"dlrm_softmax2", ModelKind::kDlrm, dlrm_logits,
                                               DlrmOutput::kSoftmax2},
                                           Net{"dlrm_softmax2_no_norm", ModelKind::kDlrm,
                                               dlrm_logits, DlrmOutput::kSoftmax2, false}),
                         [](const ::testing::TestParamInfo<Net>& info) { return info.param.name; });

// Without the key nothing changes: no norm blocks, no statistics, the layout of before.
TEST(BatchNormOff, ModelsKeepTheirLayout) {
  device::CardSet cards = device::CardSet::from_list("0");
  cards.card(0).activate();
  for (const ModelKind kind : {ModelKind::kDnn, ModelKind::kDlrm, ModelKind::kWideDeep}) {
    DenseModelConfig cfg;
    cfg.kind = kind;
    cfg.slots = 3;
    cfg.mf_dim = 3;
    cfg.dense_dim = 2;
    cfg.bot_layer_sizes = {5, 4};
    cfg.fc_sizes = {6};
    DenseModel plain(cards.card(0), cfg);
    EXPECT_EQ(plain.parameters().trained_size(), plain.parameters().size());
    for (const ParamBlock& b : plain.parameters().blocks()) {
      EXPECT_EQ(b.name.find(".bn"), std::string::npos) << b.name;
    }
    cfg.batch_norm = true;
    DenseModel normed(cards.card(0), cfg);
    EXPECT_LT(normed.parameters().trained_size(), normed.parameters().size());
  }
}

// dlrm's two-class output: the last layer 2 wide with its own norm; the logit head's layout
// (the default) has neither.
TEST(DlrmOutput, TwoClassLayerIsTwoWideWithItsNorm) {
  device::CardSet cards = device::CardSet::from_list("0");
  cards.card(0).activate();
  DenseModelConfig cfg;
  cfg.kind = ModelKind::kDlrm;
  cfg.slots = 3;
  cfg.mf_dim = 3;
  cfg.dense_dim = 2;
  cfg.bot_layer_sizes = {5, 4};
  cfg.fc_sizes = {6};
  cfg.batch_norm = true;
  const auto blocks = [&](DlrmOutput output) {
    cfg.dlrm_output = output;
    DenseModel model(cards.card(0), cfg);
    std::vector<std::string> names;
    for (const ParamBlock& b : model.parameters().blocks()) {
      names.push_back(b.name + ":" + std::to_string(b.count));
    }
    return names;
  };
  const std::vector<std::string> logit = blocks(DlrmOutput::kLogit);
  const std::vector<std::string> two = blocks(DlrmOutput::kSoftmax2);
  const auto has = [](const std::vector<std::string>& names, const std::string& name) {
    return std::find(names.begin(), names.end(), name) != names.end();
  };
  EXPECT_TRUE(has(logit, "fc_1.w:6") && has(logit, "fc_1.b:1"));
  EXPECT_FALSE(has(logit, "fc_1.bn.gamma:1"));
  EXPECT_TRUE(has(two, "fc_1.w:12") && has(two, "fc_1.b:2"));
  for (const char* stat : {"gamma", "beta", "running_mean", "running_var"}) {
    EXPECT_TRUE(has(two, std::string("fc_1.bn.") + stat + ":2")) << stat;
  }
}

}  // namespace
}  // namespace gpubox::trainer
