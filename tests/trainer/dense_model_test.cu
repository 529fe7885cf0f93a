// The whole dense model (dnn, wide_deep, wide, deepfm, fm, ffm, dlrm, xdeepfm, dcn_v2 full and
// low rank and DCN-Mix, stacked and parallel, dcn; with and without cvm): backward against
// float64 central differences of the summed log loss, for every dense parameter and every pulled
// embedding value; gradient scaling across cards; the non-finite check.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <functional>
#include <map>
#include <random>
#include <regex>
#include <tuple>

#include "heterps/device/card.hpp"
#include "heterps/heter_comm/heter_comm_types.hpp"
#include "tests/heterps/device/test_cards.hpp"
#include "tests/trainer/field_model_check.hpp"
#include "tests/trainer/one_card.hpp"
#include "tests/trainer/test_util.hpp"
#include "trainer/nn/dense_model.hpp"

namespace gpubox::trainer {
namespace {
using device::to_device;
using device::to_host;
using testing::central_difference;
using testing::expect_gradient_near;

struct HostBatch {
  std::vector<float> records;
  std::vector<uint32_t> offsets;
  std::vector<float> dense;
  std::vector<float> labels;
  int64_t batch = 0;
};

HostBatch make_batch(int64_t batch, int slots, int mf_dim, int dense_dim, std::mt19937_64& rng) {
  HostBatch h;
  h.batch = batch;
  h.offsets.push_back(0);
  std::uniform_int_distribution<int> count(0, 2), shows(0, 4);
  std::uniform_real_distribution<float> value(-0.5f, 0.5f);
  uint32_t occurrences = 0;
  for (int s = 0; s < slots; ++s) {
    for (int64_t i = 0; i < batch; ++i) {
      const int n = count(rng);
      for (int j = 0; j < n; ++j) {
        const int show = shows(rng);
        h.records.push_back(static_cast<float>(show));
        h.records.push_back(static_cast<float>(std::uniform_int_distribution<int>(0, show)(rng)));
        for (int k = 0; k < 1 + mf_dim; ++k) h.records.push_back(value(rng));
      }
      occurrences += n;
      h.offsets.push_back(occurrences);
    }
  }
  for (int64_t i = 0; i < batch * dense_dim; ++i) h.dense.push_back(value(rng) * 2);
  for (int64_t i = 0; i < batch; ++i) h.labels.push_back(static_cast<float>(rng() % 2));
  return h;
}

class DenseModelTest : public ::testing::Test, protected testing::OneCard {
 protected:
  // Device copies of a host batch, alive as long as this object.
  struct DeviceBatch {
    device::device_buffer<float> records, dense, labels;
    device::device_buffer<uint32_t> offsets;
    DenseBatchView view(int slots, int64_t batch) {
      return DenseBatchView{SlotBatchView{records.data(), offsets.data(), batch, slots},
                            dense.data(), labels.data(), batch};
    }
  };
  DeviceBatch upload(const HostBatch& h) {
    return DeviceBatch{to_device(h.records, card_.memory(), card_.stream()),
                       to_device(h.dense, card_.memory(), card_.stream()),
                       to_device(h.labels, card_.memory(), card_.stream()),
                       to_device(h.offsets, card_.memory(), card_.stream())};
  }
};

struct ModelCase {
  ModelKind kind;
  bool use_cvm;
  int cross_rank = 0;  // dcn_v2
  DcnStructure structure = DcnStructure::kStacked;
  int cross_experts = 0;  // dcn_v2 DCN-Mix
};

// Each network's draw, frozen by name: a new ModelKind must not move the other networks' data
// (seeded from the enum's value, adding one shifted the rest, and a draw can land an activation on
// a ReLU kink). The values are the enum's as they were when this table was made.
int draw_seed(ModelKind kind) {
  static const std::map<std::string, int> kSeeds = {
      {"dnn", 0},       {"wide_deep", 1}, {"wide", 2},  {"deepfm", 3},      {"dcn_v2", 4},
      {"fm", 5},        {"dcn", 6},       {"dlrm", 7},  {"xdeepfm", 8},     {"ffm", 9},
      {"deepfefm", 10}, {"autoint", 11},  {"flen", 12}, {"fat_deepffm", 13}};
  const std::string name = name_of(kModelKindNames, kind);
  const auto it = kSeeds.find(name);
  if (it == kSeeds.end()) ADD_FAILURE() << "draw_seed: give network '" << name << "' a seed";
  return it == kSeeds.end() ? 0 : it->second;
}

class ModelGradientTest : public DenseModelTest, public ::testing::WithParamInterface<ModelCase> {};

// The small network of `c` whose gradients are checked: 3 slots, 2 dense features, 2 hidden
// layers, each network's own parts as small.
DenseModelConfig gradient_check_config(const ModelCase& c) {
  DenseModelConfig cfg;
  cfg.kind = c.kind;
  cfg.use_cvm = c.use_cvm;
  cfg.slots = 3;
  cfg.mf_dim = 2;
  cfg.dense_dim = 2;
  cfg.fc_sizes = {6, 4};
  cfg.seed = 17;
  cfg.cross_layers = 2;
  cfg.cross_rank = c.cross_rank;
  cfg.dcn_structure = c.structure;
  cfg.cross_experts = c.cross_experts;
  cfg.bot_layer_sizes = {4, 1 + cfg.mf_dim};  // dlrm: its output as wide as an embedding
  cfg.cin_layer_sizes = {3, 2};               // xdeepfm
  // ffm: one factor of 2 per field (3 slots + 2 dense features).
  if (cfg.kind == ModelKind::kFfm || cfg.kind == ModelKind::kFatDeepffm) {
    cfg.mf_dim = (cfg.slots + cfg.dense_dim) * 2;  // fat_deepffm: ffm's rows
  }
  return cfg;
}

// `model`'s parameters set away from where central differences mislead, drawn from `rng`; the
// values set.
std::vector<float> start_away_from_kinks(DenseModel& model, const DenseModelConfig& cfg,
                                         std::mt19937_64& rng) {
  std::vector<float> w = model.parameters().values_to_host();
  // Biases away from zero keep every ReLU pre-activation away from its kink, where central
  // differences are meaningless (e.g. an instance with no keys and small dense values).
  for (const ParamBlock& b : model.parameters().blocks()) {
    if (b.name.size() > 2 && b.name.compare(b.name.size() - 2, 2, ".b") == 0) {
      const std::vector<float> bias = testing::random_away_from_zero(b.count, rng, 0.1f);
      std::copy(bias.begin(), bias.end(), w.begin() + b.offset);
    }
  }
  model.parameters().set_values(w);
  if (cfg.kind != ModelKind::kDnn) {
    // Start the wide weights away from zero so their effect on the forward is exercised too.
    for (const ParamBlock& b : model.parameters().blocks()) {
      if (b.name == "wide.dense_w") {
        for (std::size_t k = 0; k < b.count; ++k) w[b.offset + k] = 0.3f * (k + 1);
      }
      // fat_deepffm's dense vectors start at 1, so every dense field's factor ties in CEN's max
      // pool, where the central difference halves what the first maximum's gradient takes.
      if (b.name == "fat_deepffm.dense_w") {
        for (std::size_t k = 0; k < b.count; ++k) w[b.offset + k] = 0.1f * (k % 7) - 0.3f;
      }
    }
    model.parameters().set_values(w);
  }
  return w;
}

// Checks analytic gradients against float64 central differences of a loss. A ReLU kink within
// eps of a pre-activation makes central differences meaningless there; it shows as differences
// at eps and eps/4 that disagree. Such coordinates are skipped (counted), and may be only a few:
// a wrong backward disagrees everywhere, not at a few kinks.
struct KinkAwareGradientCheck {
  float eps = 1e-3f;
  std::size_t checked = 0;
  std::size_t skipped = 0;
  // The gradient of `loss` by values[index] against `analytic`, named `what` when it fails.
  void operator()(std::vector<float>& values, std::size_t index, double analytic,
                  const std::function<double()>& loss, const std::string& what) {
    const double coarse = central_difference(values, index, eps, loss);
    const double fine = central_difference(values, index, eps / 4, loss);
    if (std::fabs(coarse - fine) > 1e-3 + 1e-2 * std::fabs(fine)) {
      ++skipped;
      return;
    }
    ++checked;
    expect_gradient_near(analytic, fine, 2e-3, 2e-2, what);
  }
};

TEST_P(ModelGradientTest, BackwardMatchesNumericalGradientOfSummedLogLoss) {
  const DenseModelConfig cfg = gradient_check_config(GetParam());
  DenseModel model(card_, cfg);
  std::mt19937_64 rng(cfg.use_cvm * 3 + draw_seed(cfg.kind));
  HostBatch h = make_batch(5, cfg.slots, cfg.mf_dim, cfg.dense_dim, rng);
  std::vector<float> w = start_away_from_kinks(model, cfg, rng);
  const GradScales scales{1.0f / static_cast<float>(h.batch), 1.0f};
  const std::size_t occurrences = h.offsets.back();
  auto push = card_.make_buffer<float>(occurrences * model.pool().push_dim());
  auto scratch = card_.make_buffer<float>(occurrences * model.pool().push_dim());

  auto batch = upload(h);
  const double loss = model.forward_backward(batch.view(cfg.slots, h.batch), scales, push.data());
  EXPECT_TRUE(std::isfinite(loss));
  const std::vector<float> grads = model.parameters().grads_to_host();
  const std::vector<float> push_host = to_host(push);

  auto summed_loss = [&] {
    model.parameters().set_values(w);
    auto b = upload(h);
    return model.forward_backward(b.view(cfg.slots, h.batch), scales, scratch.data());
  };
  EXPECT_NEAR(summed_loss(), loss, 1e-6 * loss);
  KinkAwareGradientCheck check;
  for (const ParamBlock& block : model.parameters().blocks()) {
    for (std::size_t k = 0; k < block.count; ++k) {
      check(w, block.offset + k, grads[block.offset + k] * h.batch, summed_loss,
            block.name + "[" + std::to_string(k) + "]");
    }
  }
  const int pull_dim = model.pool().pull_dim();
  for (std::size_t j = 0; j < occurrences; ++j) {
    for (int k = 2; k < pull_dim; ++k) {  // embed_w, embedx_w: show/click carry counters
      check(
          h.records, j * pull_dim + k, push_host[j * pull_dim + k],
          [&] {
            auto b = upload(h);
            model.parameters().set_values(w);
            return model.forward_backward(b.view(cfg.slots, h.batch), scales, scratch.data());
          },
          "occurrence " + std::to_string(j) + " field " + std::to_string(k));
    }
  }
  EXPECT_LE(check.skipped * 10, check.checked)
      << check.skipped << " of " << check.checked + check.skipped
      << " coordinates sit on a ReLU kink";
  EXPECT_GT(check.checked, 0u);
}

INSTANTIATE_TEST_SUITE_P(
    Models, ModelGradientTest,
    ::testing::Values(ModelCase{ModelKind::kDnn, false}, ModelCase{ModelKind::kDnn, true},
                      ModelCase{ModelKind::kWideDeep, false}, ModelCase{ModelKind::kWideDeep, true},
                      ModelCase{ModelKind::kWide, false}, ModelCase{ModelKind::kWide, true},
                      ModelCase{ModelKind::kDeepFm, false}, ModelCase{ModelKind::kDeepFm, true},
                      ModelCase{ModelKind::kFm, false}, ModelCase{ModelKind::kFm, true},
                      ModelCase{ModelKind::kDlrm, false}, ModelCase{ModelKind::kDlrm, true},
                      ModelCase{ModelKind::kDcnV2, false, 0, DcnStructure::kStacked},
                      ModelCase{ModelKind::kDcnV2, true, 0, DcnStructure::kParallel},
                      ModelCase{ModelKind::kDcnV2, false, 2, DcnStructure::kParallel},
                      ModelCase{ModelKind::kDcnV2, true, 2, DcnStructure::kStacked},
                      ModelCase{ModelKind::kDcnV2, false, 2, DcnStructure::kStacked, 3},
                      ModelCase{ModelKind::kDcnV2, true, 3, DcnStructure::kParallel, 2},
                      ModelCase{ModelKind::kDcn, false}, ModelCase{ModelKind::kDcn, true},
                      ModelCase{ModelKind::kXdeepfm, false}, ModelCase{ModelKind::kXdeepfm, true},
                      ModelCase{ModelKind::kFfm, false}, ModelCase{ModelKind::kFfm, true},
                      ModelCase{ModelKind::kDeepFefm, false}, ModelCase{ModelKind::kDeepFefm, true},
                      ModelCase{ModelKind::kFatDeepffm, false},
                      ModelCase{ModelKind::kFatDeepffm, true}));

// hyper_parameters.cross_l2 as the whole model applies it: with the dense scale 1 / global batch,
// the gradients with the penalty minus those without are 2 * l2 * (local batch / global batch)
// * w on the cross weights and nothing elsewhere (so the cards' terms sum to 2 * l2 * w once),
// and the loss reported is the data's alone.
TEST_F(DenseModelTest, CrossL2AddsItsGradientTermOnTheCrossWeightsOnly) {
  for (const auto& [kind, experts] :
       {std::pair{ModelKind::kDcn, 0}, std::pair{ModelKind::kDcnV2, 0},
        std::pair{ModelKind::kDcnV2, 2}}) {
    SCOPED_TRACE(std::string(name_of(kModelKindNames, kind)) + " experts " +
                 std::to_string(experts));
    DenseModelConfig cfg;
    cfg.kind = kind;
    cfg.slots = 3;
    cfg.mf_dim = 2;
    cfg.dense_dim = 2;
    cfg.fc_sizes = {4};
    cfg.cross_layers = 2;
    cfg.cross_rank = experts > 0 ? 2 : 0;
    cfg.cross_experts = experts;
    std::mt19937_64 rng(31);
    HostBatch h = make_batch(6, cfg.slots, cfg.mf_dim, cfg.dense_dim, rng);
    const GradScales scales{1.0f / 24, 1.0f};  // this card's 6 of a global batch of 24
    auto run = [&](float l2) {
      cfg.cross_l2 = l2;
      DenseModel model(card_, cfg);
      auto b = upload(h);
      auto push = card_.make_buffer<float>(h.offsets.back() * model.pool().push_dim());
      const double loss = model.forward_backward(b.view(cfg.slots, h.batch), scales, push.data());
      return std::make_tuple(loss, model.parameters().grads_to_host(),
                             model.parameters().values_to_host(), model.parameters().blocks());
    };
    const auto [loss0, g0, values, blocks] = run(0.0f);
    const float l2 = 0.125f;
    const auto with_l2 = run(l2);
    EXPECT_EQ(std::get<0>(with_l2), loss0);
    const std::vector<float>& g1 = std::get<1>(with_l2);
    std::size_t penalised = 0;
    for (const ParamBlock& b : blocks) {
      const bool weight = b.name.rfind("cross_", 0) == 0 && b.name.rfind("cross_gate", 0) != 0 &&
                          b.name != "cross_out.w" &&
                          b.name.compare(b.name.size() - 2, 2, ".b") != 0;
      penalised += weight ? 1 : 0;
      for (std::size_t k = 0; k < b.count; ++k) {
        const double want = weight ? 2.0 * l2 * 6 / 24 * values[b.offset + k] : 0.0;
        EXPECT_NEAR(g1[b.offset + k] - g0[b.offset + k], want, 1e-6) << b.name << "[" << k << "]";
      }
    }
    EXPECT_EQ(penalised, kind == ModelKind::kDcnV2 && experts > 0 ? 6u : 2u);
  }
}

// dcn_v2's shapes: the cross blocks (full: D x D, low rank: D x r and r x D, a bias each; parallel:
// the logit layer's cross half), its flops on top of the MLP's (stacked: the first layer's input
// gradient over every column, the cross network takes it), and bf16 asked for runs bf16 where the
// card has bf16 GEMMs (the MLP and the cross GEMMs; the cross rows stay fp32).
TEST_F(DenseModelTest, DcnV2ShapesAndPrecision) {
  DenseModelConfig cfg;
  cfg.kind = ModelKind::kDcnV2;
  cfg.slots = 4;
  cfg.mf_dim = 3;
  cfg.dense_dim = 2;  // D = 4 x 4 + 2 = 18
  cfg.fc_sizes = {8};
  cfg.cross_layers = 2;
  cfg.precision = DensePrecision::kBf16;
  const std::size_t d = 18;
  for (const int rank : {0, 5}) {
    for (const DcnStructure structure : {DcnStructure::kStacked, DcnStructure::kParallel}) {
      cfg.cross_rank = rank;
      cfg.dcn_structure = structure;
      DenseModel model(card_, cfg);
      EXPECT_EQ(model.precision(), Blas(card_).bf16() == Bf16Support::kNone
                                       ? DensePrecision::kFp32
                                       : DensePrecision::kBf16);
      const bool parallel = structure == DcnStructure::kParallel;
      std::size_t count = 0;
      for (const ParamBlock& b : model.parameters().blocks()) count += b.count;
      const std::size_t per_layer = (rank == 0 ? d * d : 2 * d * rank) + d;
      EXPECT_EQ(count, (d * 8 + 8) + (8 + 1) + 2 * per_layer + (parallel ? d : 0));
      const double mlp_macs = 8.0 * (2 * d + (parallel ? 16 : d)) + 3 * 8.0;
      const double cross_macs =
          2 * 3.0 * (rank == 0 ? d * d : 2.0 * d * rank) + (parallel ? 2.0 * d : 0);
      EXPECT_DOUBLE_EQ(model.flops_per_example(), 2 * (mlp_macs + cross_macs));
    }
  }
}

// dcn and dcn_v2 (full and low rank, DCN-Mix; stacked and parallel) in bf16
// (GPUBOX_BF16_EMULATION where the CPU has no bf16 GEMMs): the cross network over fp32 rows
// (dcn_v2's GEMMs on bf16 roundings of them, dcn's GEMV in fp32), the MLP over their bf16 copy
// (stacked: the cross output's), within bf16's rounding of the fp32 model from the same weights,
// over n instances and over one; an empty batch gives zero gradients. The kernel report names the
// cross GEMMs' precision.
TEST_F(DenseModelTest, CrossNetworksInBf16StayNearFp32) {
  struct Case {
    ModelKind kind;
    int rank, experts;
    DcnStructure structure;
  };
  for (const Case& c : {Case{ModelKind::kDcn, 0, 0, DcnStructure::kParallel},
                        Case{ModelKind::kDcnV2, 0, 0, DcnStructure::kStacked},
                        Case{ModelKind::kDcnV2, 2, 0, DcnStructure::kParallel},
                        Case{ModelKind::kDcnV2, 2, 2, DcnStructure::kStacked}}) {
    DenseModelConfig cfg;
    cfg.kind = c.kind;
    cfg.slots = 3;
    cfg.mf_dim = 4;
    cfg.dense_dim = 3;
    cfg.fc_sizes = {16, 8};
    cfg.cross_layers = 2;
    cfg.cross_rank = c.rank;
    cfg.cross_experts = c.experts;
    cfg.dcn_structure = c.structure;
    SCOPED_TRACE(std::string(name_of(kModelKindNames, c.kind)) + " rank " + std::to_string(c.rank) +
                 " experts " + std::to_string(c.experts));
    for (const int64_t batch : {int64_t{64}, int64_t{1}}) {
      testing::expect_bf16_near_fp32(card_, cfg, 23, 0.05, 0.05, batch);
    }
    cfg.precision = DensePrecision::kBf16;
    setenv("GPUBOX_BF16_EMULATION", "1", 1);
    DenseModel model(card_, cfg);
    unsetenv("GPUBOX_BF16_EMULATION");
    std::mt19937_64 rng(5);
    auto e = upload(make_batch(0, cfg.slots, cfg.mf_dim, cfg.dense_dim, rng));
    EXPECT_EQ(model.forward_backward(e.view(cfg.slots, 0), GradScales{}, nullptr), 0.0);
    for (float g : model.parameters().grads_to_host()) ASSERT_EQ(g, 0.0f);
    const bool bf16_gemms = c.kind == ModelKind::kDcnV2;
    const std::string report = model.kernel_report(0);  // the batch it ran
    EXPECT_EQ(report.find("gemm_bf16 (bf16 operands") != std::string::npos, bf16_gemms) << report;
    EXPECT_EQ(report.find("sgemm (fp32) + elementwise (fp32") != std::string::npos, !bf16_gemms)
        << report;
    // The cross line, then a line of its own for the MLP's bf16 copy.
    const std::size_t cross = report.find("\n  cross ");
    ASSERT_NE(cross, std::string::npos) << report;
    EXPECT_EQ(report.find("\n  MLP input: the cross net's fp32 "), report.find('\n', cross + 1))
        << report;
  }
}

TEST_F(DenseModelTest, LayerShapesFollowTheConfig) {
  DenseModelConfig cfg;  // config_gpubox: 26 slots x (1 + 8) + 13 -> 512-256-128-32-1
  DenseModel model(card_, cfg);
  EXPECT_EQ(model.input_dim(), 26 * 9 + 13);
  // Forward, weight gradient and input gradient of every layer; the first layer's input
  // gradient only for its 26 x 9 pooled inputs (the dense features need none).
  const double macs =
      512.0 * (2 * 247 + 26 * 9) + 3 * (512.0 * 256 + 256.0 * 128 + 128.0 * 32 + 32.0);
  EXPECT_DOUBLE_EQ(model.flops_per_example(), 2 * macs);
  std::size_t expected = 0;
  for (const ParamBlock& b : model.parameters().blocks()) expected += b.count;
  EXPECT_EQ(expected,
            247u * 512 + 512 + 512 * 256 + 256 + 256 * 128 + 128 + 128 * 32 + 32 + 32 + 1);
  EXPECT_GE(model.parameters().size(), expected);
}

TEST_F(DenseModelTest, CardsWithHalfTheBatchSumToTheFullBatchGradient) {
  GPUBOX_REQUIRE_CARDS(2);
  // What the all-reduce relies on: with dense scale 1 / global batch, the sum of two cards'
  // gradients over two halves equals one card's gradient over the whole batch, and every card
  // starts from the same weights.
  DenseModelConfig cfg;
  cfg.kind = ModelKind::kWideDeep;
  cfg.slots = 4;
  cfg.mf_dim = 3;
  cfg.dense_dim = 3;
  cfg.fc_sizes = {16, 8};
  cfg.seed = 5;
  device::CardSet two = device::CardSet::from_list("0,1");
  DenseModel whole(card_, cfg);
  DenseModel half_a(two.card(0), cfg);
  DenseModel half_b(two.card(1), cfg);
  EXPECT_EQ(half_a.parameters().values_to_host(), whole.parameters().values_to_host());
  EXPECT_EQ(half_b.parameters().values_to_host(), whole.parameters().values_to_host());
  std::mt19937_64 rng(8);
  const int64_t n = 12;
  HostBatch h = make_batch(n, cfg.slots, cfg.mf_dim, cfg.dense_dim, rng);
  // Split instance-wise: rows [0, 6) and [6, 12) with their own slot-major offsets.
  auto split = [&](int64_t lo, int64_t hi) {
    HostBatch part;
    part.batch = hi - lo;
    part.offsets.push_back(0);
    const int pull = 3 + cfg.mf_dim;
    for (int s = 0; s < cfg.slots; ++s) {
      for (int64_t i = lo; i < hi; ++i) {
        for (uint32_t j = h.offsets[s * n + i]; j < h.offsets[s * n + i + 1]; ++j) {
          part.records.insert(part.records.end(), h.records.begin() + j * pull,
                              h.records.begin() + (j + 1) * pull);
        }
        part.offsets.push_back(static_cast<uint32_t>(part.records.size() / pull));
      }
    }
    part.dense.assign(h.dense.begin() + lo * cfg.dense_dim, h.dense.begin() + hi * cfg.dense_dim);
    part.labels.assign(h.labels.begin() + lo, h.labels.begin() + hi);
    return part;
  };
  const GradScales scales{1.0f / n, 1.0f};
  auto run = [&](DenseModel& model, const HostBatch& part) {
    auto b = upload(part);
    auto push = card_.make_buffer<float>(part.offsets.back() * model.pool().push_dim());
    const double loss = model.forward_backward(b.view(cfg.slots, part.batch), scales, push.data());
    return std::make_pair(loss, to_host(push));
  };
  const auto [loss_whole, push_whole] = run(whole, h);
  const HostBatch a = split(0, 6), b = split(6, n);
  const auto [loss_a, push_a] = run(half_a, a);
  const auto [loss_b, push_b] = run(half_b, b);
  EXPECT_NEAR(loss_a + loss_b, loss_whole, 1e-5 * loss_whole);
  const std::vector<float> g = whole.parameters().grads_to_host();
  const std::vector<float> ga = half_a.parameters().grads_to_host();
  const std::vector<float> gb = half_b.parameters().grads_to_host();
  for (std::size_t k = 0; k < g.size(); ++k) {
    EXPECT_NEAR(ga[k] + gb[k], g[k], 1e-6 + 1e-4 * std::fabs(g[k]))
        << whole.parameters().describe(k);
  }
  // Push records are per instance: the halves' records are the whole batch's, regrouped
  // (push and pull records have the same width, so split() regroups them too).
  h.records = push_whole;
  const std::vector<float> whole_a = split(0, 6).records, whole_b = split(6, n).records;
  ASSERT_EQ(push_a.size(), whole_a.size());
  ASSERT_EQ(push_b.size(), whole_b.size());
  for (std::size_t k = 0; k < push_a.size(); ++k) EXPECT_NEAR(push_a[k], whole_a[k], 1e-5);
  for (std::size_t k = 0; k < push_b.size(); ++k) EXPECT_NEAR(push_b[k], whole_b[k], 1e-5);
}

TEST_F(DenseModelTest, EmptyBatchGivesZeroGradientsAndPredictMatchesTraining) {
  DenseModelConfig cfg;
  cfg.slots = 2;
  cfg.mf_dim = 2;
  cfg.dense_dim = 1;
  cfg.fc_sizes = {4};
  DenseModel model(card_, cfg);
  std::mt19937_64 rng(9);
  HostBatch h = make_batch(7, cfg.slots, cfg.mf_dim, cfg.dense_dim, rng);
  auto b = upload(h);
  auto push = card_.make_buffer<float>(h.offsets.back() * model.pool().push_dim());
  model.forward_backward(b.view(cfg.slots, h.batch), GradScales{}, push.data());
  const std::vector<float> train_preds = to_host(model.predictions(), h.batch, card_.stream());
  model.predict(b.view(cfg.slots, h.batch));
  EXPECT_EQ(to_host(model.predictions(), h.batch, card_.stream()), train_preds);

  HostBatch empty = make_batch(0, cfg.slots, cfg.mf_dim, cfg.dense_dim, rng);
  auto e = upload(empty);
  EXPECT_EQ(model.forward_backward(e.view(cfg.slots, 0), GradScales{}, nullptr), 0.0);
  for (float g : model.parameters().grads_to_host()) ASSERT_EQ(g, 0.0f);
}

TEST_F(DenseModelTest, NonFiniteLossOrGradientIsReportedWithPassBatchAndParameter) {
  DenseModelConfig cfg;
  cfg.slots = 2;
  cfg.mf_dim = 1;
  cfg.dense_dim = 2;
  cfg.fc_sizes = {3};
  DenseModel model(card_, cfg);
  std::mt19937_64 rng(10);
  HostBatch h = make_batch(4, cfg.slots, cfg.mf_dim, cfg.dense_dim, rng);
  auto push = card_.make_buffer<float>(h.offsets.back() * model.pool().push_dim());
  {
    auto b = upload(h);
    const double loss =
        model.forward_backward(b.view(cfg.slots, h.batch), GradScales{}, push.data());
    EXPECT_NO_THROW(model.check_finite(loss, 1, 1));
  }
  h.dense[3] = std::nanf("");
  auto b = upload(h);
  const double loss = model.forward_backward(b.view(cfg.slots, h.batch), GradScales{}, push.data());
  try {
    model.check_finite(loss, 3, 7);
    FAIL() << "a NaN input passed the check";
  } catch (const Error& e) {
    const std::string what = e.what();
    // The fused ReLU may turn the NaN pre-activation into 0 (oneDNN computes max(x, 0)), so the
    // loss can stay finite; the NaN then reaches the first layer's weight gradient instead.
    EXPECT_NE(what.find("pass 3, batch 7: "), std::string::npos) << what;
    EXPECT_TRUE(what.find("the loss is nan") != std::string::npos ||
                what.find("gradient of fc_0.w[") != std::string::npos)
        << what;
    EXPECT_NE(what.find("nan"), std::string::npos) << what;
  }
  // A finite loss with a bad gradient names the parameter.
  std::vector<float> g = model.parameters().grads_to_host();
  std::fill(g.begin(), g.end(), 0.0f);
  const ParamBlock& fc1_w = model.parameters().blocks()[2];
  ASSERT_EQ(fc1_w.name, "fc_1.w");
  g[fc1_w.offset + 2] = std::numeric_limits<float>::infinity();
  device::copy_async(model.parameters().grads().data(), g.data(), g.size(), card_.stream());
  card_.stream().synchronize();
  try {
    model.check_finite(1.0, 4, 2);
    FAIL() << "an infinite gradient passed the check";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("pass 4, batch 2: gradient of fc_1.w[2] is inf"),
              std::string::npos)
        << e.what();
  }
  // The clip's veto (HeterComm::push_pulled: finite dense gradients, a sparse one not) names the
  // clip's norm, not a parameter or the loss.
  DenseStepStatus clipped;
  clipped.first_non_finite = heter_comm::kNonFiniteNorm;
  try {
    model.throw_if_non_finite(clipped, 5, 9);
    FAIL() << "the clip's veto passed the check";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("pass 5, batch 9: the global gradient norm of "
                                         "hyper_parameters.optimizer.clip_by_norm is not finite"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace gpubox::trainer
