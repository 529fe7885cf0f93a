// autoint (AutointPart, autoint.cu) against a float64 reference written from the network's
// definition (PaddleRec's models/rank/autoint net.py: the fields' embeddings with the dense
// features' x_i e_i, the interacting layers relu(H W_q|k|v|r), per-head softmax(Q K^T / sqrt(a)) V,
// relu(O + R), LayerNorm; the flattened last layer into the logit; the first-order term with
// use_wide; the DNN over the fields with fc_sizes): predictions and every gradient (dense
// parameters and pulled values) against central differences (field_model_check.hpp); shapes,
// flops of PaddleRec's config.yaml by hand; refusals.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "heterps/device/card.hpp"
#include "tests/trainer/field_model_check.hpp"
#include "tests/trainer/one_card.hpp"
#include "trainer/nn/dense_model.hpp"
#include "trainer/nn/detail/lane_max.cuh"

namespace gpubox::trainer {
namespace {
using testing::NamedParams;
using Matrix = std::vector<std::vector<double>>;  // [fields][cols]

// One interacting layer of net.py in float64.
Matrix interacting_layer(const DenseModelConfig& cfg, const NamedParams& p, std::size_t l,
                         const Matrix& x) {
  const std::string name = "autoint_" + std::to_string(l);
  const std::size_t fields = x.size(), in = x[0].size(), cols = cfg.attn_layer_sizes[l];
  const std::size_t proj = (cfg.attn_residual ? 4 : 3) * cols, heads = cfg.attn_heads;
  const std::size_t a = cols / heads;
  Matrix z(fields, std::vector<double>(proj, 0.0));  // relu(x W): Q | K | V | R
  for (std::size_t f = 0; f < fields; ++f) {
    for (std::size_t c = 0; c < proj; ++c) {
      for (std::size_t r = 0; r < in; ++r) z[f][c] += x[f][r] * p(name + ".w", r * proj + c);
      z[f][c] = std::max(z[f][c], 0.0);
    }
  }
  Matrix y(fields, std::vector<double>(cols, 0.0));
  for (std::size_t h = 0; h < heads; ++h) {
    for (std::size_t i = 0; i < fields; ++i) {
      std::vector<double> s(fields);
      double top = -1e300, sum = 0;
      for (std::size_t j = 0; j < fields; ++j) {
        for (std::size_t c = 0; c < a; ++c) s[j] += z[i][h * a + c] * z[j][cols + h * a + c];
        if (cfg.attn_scaling) s[j] /= std::sqrt(static_cast<double>(a));
        top = std::max(top, s[j]);
      }
      for (double& v : s) sum += (v = std::exp(v - top));
      for (std::size_t c = 0; c < a; ++c) {
        for (std::size_t j = 0; j < fields; ++j) {
          y[i][h * a + c] += s[j] / sum * z[j][2 * cols + h * a + c];
        }
      }
    }
  }
  for (std::size_t i = 0; i < fields; ++i) {
    double mean = 0, var = 0;
    for (std::size_t c = 0; c < cols; ++c) {
      if (cfg.attn_residual) y[i][c] += z[i][3 * cols + c];
      y[i][c] = std::max(y[i][c], 0.0);
      mean += y[i][c] / cols;
    }
    for (std::size_t c = 0; c < cols; ++c) var += (y[i][c] - mean) * (y[i][c] - mean) / cols;
    for (std::size_t c = 0; c < cols; ++c) {
      y[i][c] = p(name + ".ln_gamma", c) * (y[i][c] - mean) / std::sqrt(var + 1e-8) +
                p(name + ".ln_beta", c);
    }
  }
  return y;
}

struct Reference {
  const DenseModelConfig& cfg;
  double operator()(const testing::HostBatch& h, int64_t i, const NamedParams& p,
                    const std::vector<double>& rec) const {
    Matrix x0;
    std::vector<double> cvm;
    double logit = 0;
    for (const auto& sum : testing::pooled_slots(h, cfg, i, rec)) {
      cvm.push_back(std::log(sum[0] + 1));
      cvm.push_back(std::log(sum[1] + 1) - std::log(sum[0] + 1));
      if (cfg.attn_use_wide) logit += sum[2];
      x0.emplace_back(sum.begin() + 3, sum.end());
    }
    for (int f = 0; f < cfg.dense_dim; ++f) {
      const double x = h.dense[i * cfg.dense_dim + f];
      if (cfg.attn_use_wide) logit += x * p("wide.dense_w", f);
      std::vector<double> e(cfg.mf_dim);
      for (int d = 0; d < cfg.mf_dim; ++d) e[d] = x * p("autoint.dense_w", f * cfg.mf_dim + d);
      x0.push_back(e);
    }
    Matrix hl = x0;
    for (std::size_t l = 0; l < cfg.attn_layer_sizes.size(); ++l) {
      hl = interacting_layer(cfg, p, l, hl);
    }
    std::size_t k = 0;
    for (const auto& row : hl) {
      for (double v : row) logit += v * p("autoint_out.w", k++);
    }
    if (cfg.fc_sizes.empty()) return logit + p("wide.bias", 0);
    std::vector<double> r;  // the DNN input: column f D + d, then the cvm features
    for (const auto& field : x0) r.insert(r.end(), field.begin(), field.end());
    if (cfg.use_cvm) r.insert(r.end(), cvm.begin(), cvm.end());
    for (std::size_t l = 0; l <= cfg.fc_sizes.size(); ++l) {
      r = p.linear("fc_" + std::to_string(l), r, l < cfg.fc_sizes.size());
    }
    return logit + r.at(0);
  }
};

struct AutointCase {
  bool use_cvm;
  std::vector<int> fc_sizes;
  bool residual;
  bool scaling;
  bool use_wide;
  int slots = 3;
  int dense_dim = 2;
};

class AutointTest : public ::testing::TestWithParam<AutointCase>, protected testing::OneCard {
 protected:
  DenseModelConfig config() const {
    DenseModelConfig cfg;
    cfg.kind = ModelKind::kAutoint;
    cfg.slots = GetParam().slots;
    cfg.mf_dim = 4;
    cfg.dense_dim = GetParam().dense_dim;
    cfg.attn_layer_sizes = {4, 6};
    cfg.attn_heads = 2;
    cfg.fc_sizes = GetParam().fc_sizes;
    cfg.attn_residual = GetParam().residual;
    cfg.attn_scaling = GetParam().scaling;
    cfg.attn_use_wide = GetParam().use_wide;
    cfg.use_cvm = GetParam().use_cvm;
    cfg.seed = 31;
    return cfg;
  }
};

TEST_P(AutointTest, PredictionsAndGradientsMatchAFloat64Reference) {
  const DenseModelConfig cfg = config();
  DenseModel model(card_, cfg);
  testing::check_batch_sizes(card_, model, 61 + cfg.fc_sizes.size() + cfg.use_cvm, Reference{cfg});
}

// A batch of several attention chunks and a shorter last one (a cpu card of one thread runs the
// attention 8 instances at a time, autoint.cu's attention_chunk; CUDA and cards of more threads
// the whole batch), on a card of one thread: 19 instances are chunks of 8, 8 and 3, whose rows of
// P, dS and the projections must be at their own offsets.
TEST_P(AutointTest, ABatchOfSeveralAttentionChunksMatchesAFloat64Reference) {
  device::CardSet cards = device::CardSet::from_list("0", 0, 1, 1);
  device::Card& card = cards.card(0);
  card.activate();
  const DenseModelConfig cfg = config();
  DenseModel model(card, cfg);
  testing::check_against_reference(card, model, 71 + cfg.fc_sizes.size(), Reference{cfg}, 19);
}

TEST_P(AutointTest, ShapesAndFlops) {
  const DenseModelConfig cfg = config();
  DenseModel model(card_, cfg);
  const std::size_t proj = cfg.attn_residual ? 4 : 3;
  std::size_t count = 0;
  for (const ParamBlock& b : model.parameters().blocks()) count += b.count;
  // F = slots + dense_dim fields of D = 4 (5 in most cases); layers 4 x 4 proj, 4 x 6 proj; out
  // F x 6; the dense embeddings dense_dim x 4.
  const std::size_t fields = cfg.slots + cfg.dense_dim;
  std::size_t expected =
      4 * proj * 4 + 2 * 4 + 4 * proj * 6 + 2 * 6 + fields * 6 + cfg.dense_dim * 4;
  if (cfg.attn_use_wide) expected += cfg.dense_dim;  // wide.dense_w
  const std::size_t dnn_in = fields * 4 + (cfg.use_cvm ? 2 * cfg.slots : 0);
  expected += cfg.fc_sizes.empty() ? 1 : dnn_in * 5 + 5 + 5 + 1;
  EXPECT_EQ(count, expected);
  const double layers = 3.0 * fields * (4 * proj * 4 + 4 * proj * 6) +
                        6.0 * static_cast<double>(fields * fields) * (4 + 6);
  const double dnn = cfg.fc_sizes.empty() ? 0.0 : 5.0 * (2.0 * dnn_in + 20) + 1.0 * (3 * 5);
  EXPECT_DOUBLE_EQ(model.flops_per_example(), 2 * (layers + dnn));
}

TEST_P(AutointTest, RefusesWhatTheAttentionCannotTake) {
  DenseModelConfig cfg = config();
  cfg.slot_dims.assign(cfg.slots, 4);
  cfg.slot_dims[1] = 2;
  std::string why = testing::refusal(card_, cfg);
  EXPECT_NE(why.find("hyper_parameters.slot_dims"), std::string::npos) << why;
  cfg = config();
  cfg.attn_layer_sizes = {};
  EXPECT_THROW(DenseModel(card_, cfg), Error);
  cfg = config();
  cfg.attn_layer_sizes = {5};  // 2 heads
  why = testing::refusal(card_, cfg);
  EXPECT_NE(why.find("head_num"), std::string::npos) << why;
}

// bf16 asked for (emulated where the CPU has no bf16 GEMMs): the MLP runs in it beside the fp32
// attention (field_bf16_test.cu); without fc_sizes there is no MLP, whose GEMMs are what bf16
// changes, and the net runs in fp32.
TEST_P(AutointTest, Bf16RunsTheMlpInBf16AndANetWithoutOneInFp32) {
  DenseModelConfig cfg = config();
  cfg.precision = DensePrecision::kBf16;
  setenv("GPUBOX_BF16_EMULATION", "1", 1);
  DenseModel model(card_, cfg);
  unsetenv("GPUBOX_BF16_EMULATION");
  EXPECT_EQ(model.precision(),
            cfg.fc_sizes.empty() ? DensePrecision::kFp32 : DensePrecision::kBf16);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, AutointTest,
    ::testing::Values(AutointCase{false, {}, true, true, true},    // PaddleRec's config.yaml
                      AutointCase{true, {5}, true, true, false},   // config_bigdata.yaml's shape
                      AutointCase{true, {5}, false, false, true},  // no residual, unscaled
                      // F = 17: SoftmaxRows' row maximum over two blocks of 8 lanes and a tail.
                      AutointCase{false, {}, true, true, true, 13, 4}));

// detail::lane_max (SoftmaxRows' row maximum over 8 lanes) against a scan, bit for bit, on rows of
// every length from 0 to 40 (no, one, several blocks of 8 and the tails between): random values
// with repeats, -inf, NaNs and a row's zeros of one sign; rows of zeros of both signs give an equal
// value (either sign: exp(p - top) is the same).
TEST(AutointSoftmax, LaneMaxIsTheScansMaximumBitForBit) {
  const auto bits = [](float f) {
    std::uint32_t b;
    std::memcpy(&b, &f, sizeof b);
    return b;
  };
  const auto scan = [](const std::vector<float>& p) {
    float top = -INFINITY;
    for (const float v : p) top = v > top ? v : top;
    return top;
  };
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<float> value(-8.0f, 8.0f);
  std::uniform_int_distribution<int> kind(0, 9);
  for (int n = 0; n <= 40; ++n) {
    for (int trial = 0; trial < 200; ++trial) {
      const float zero = trial % 2 == 0 ? 0.0f : -0.0f;
      std::vector<float> p(n);
      for (float& v : p) {
        switch (kind(rng)) {
          case 0:
            v = -INFINITY;
            break;
          case 1:
            v = NAN;
            break;
          case 2:
            v = zero;
            break;
          case 3:
            v = 1.5f;
            break;  // repeats
          default:
            v = value(rng);
            break;
        }
      }
      if (trial % 50 == 0 && n > 0) p[trial % n] = 1e30f;  // the top in any one lane or the tail
      const float want = scan(p);
      const float got = detail::lane_max<8>(p.data(), n);
      ASSERT_EQ(bits(got), bits(want)) << "n = " << n << ", trial " << trial;
    }
    std::vector<float> zeros(n);
    for (int j = 0; j < n; ++j) zeros[j] = j % 3 == 0 ? -0.0f : 0.0f;
    EXPECT_EQ(detail::lane_max<8>(zeros.data(), n), n == 0 ? -INFINITY : 0.0f) << "n = " << n;
  }
}

// PaddleRec's models/rank/autoint/config.yaml: 26 slots, 13 dense features, embedding_dim 16,
// attn_layer_sizes [64, 64, 64], 2 heads, residual, no DNN. By hand, per example: F = 39;
// projections 3 x 39 x (16 x 256 + 64 x 256 + 64 x 256) = 4,313,088 multiply-adds; attention
// 6 x 39 x 39 x 64 x 3 = 1,752,192; x2.
TEST(AutointFlops, PaddleRecConfig) {
  device::CardSet cards = device::CardSet::from_list("0");
  cards.card(0).activate();
  DenseModelConfig cfg;
  cfg.kind = ModelKind::kAutoint;
  cfg.slots = 26;
  cfg.mf_dim = 16;
  cfg.dense_dim = 13;
  cfg.fc_sizes = {};
  DenseModel model(cards.card(0), cfg);
  EXPECT_DOUBLE_EQ(model.flops_per_example(), 2.0 * (4313088 + 1752192));
}

}  // namespace
}  // namespace gpubox::trainer
