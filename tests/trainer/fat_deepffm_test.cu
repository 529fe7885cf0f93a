// fat_deepffm (FatDeepffmPart, fat_deepffm_part.cu) against a float64 reference written from
// PaddleRec's models/rank/fat_deepffm net.py: the field-aware vectors F[i, j] (a slot's from its
// pooled row, a dense feature's x_d E[d, j]), CEN (max over each vector, two ReLU layers N^2 x
// N^2, the attention scaling each vector), the first-order sum of every attended value, the
// pairs' Hadamard products O[i, j] * O[j, i] into the DNN, logit = first order + DNN; with dropout
// the DNN's hidden units and output dropped and the second, undropped bias added after them. Its
// predictions and every gradient (dense parameters and pulled values) against central differences
// of the reference's summed log loss; its shapes; its refusals.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "heterps/device/card.hpp"
#include "tests/heterps/device/test_cards.hpp"
#include "tests/trainer/dropout_reference.hpp"
#include "tests/trainer/field_model_check.hpp"
#include "tests/trainer/one_card.hpp"
#include "trainer/nn/dense_model.hpp"
#include "trainer/nn/fat_deepffm_part.hpp"

namespace gpubox::trainer {
namespace {

// fat_deepffm's logit of instance i in float64. With `drop` (PaddleRec's net at p > 0): the DNN's
// hidden units and its output (its bias b inside) dropped, then FAT_DeepFFMLayer.bias added:
// drop(w.h + b) + first-order + bias.
double fat_deepffm_logit(const DenseModelConfig& cfg, const testing::HostBatch& h, int64_t i,
                         const testing::NamedParams& p, const std::vector<double>& rec,
                         const testing::DropoutReference& drop = {}) {
  const int n = cfg.slots + cfg.dense_dim;
  const int k = cfg.mf_dim / n;
  // f[i * n + j][e]: field i's vector toward field j.
  std::vector<std::vector<double>> f(n * n, std::vector<double>(k));
  const std::vector<std::vector<double>> slots = testing::pooled_slots(h, cfg, i, rec);
  for (int a = 0; a < n; ++a) {
    for (int b = 0; b < n; ++b) {
      for (int e = 0; e < k; ++e) {
        if (a < cfg.slots) {
          f[a * n + b][e] = slots[a][3 + b * k + e];
        } else {
          const int d = a - cfg.slots;
          f[a * n + b][e] =
              h.dense[i * cfg.dense_dim + d] * p("fat_deepffm.dense_w", (d * n + b) * k + e);
        }
      }
    }
  }
  std::vector<double> pooled(n * n);
  for (int c = 0; c < n * n; ++c) pooled[c] = *std::max_element(f[c].begin(), f[c].end());
  const std::vector<double> attn = p.linear("cen.fc_1", p.linear("cen.fc_0", pooled, true), true);
  double first = 0;
  for (int c = 0; c < n * n; ++c) {
    for (int e = 0; e < k; ++e) first += attn[c] * f[c][e];
  }
  std::vector<double> x;  // the pairs' products, then with cvm each slot's show/click features
  for (int a = 0; a < n; ++a) {
    for (int b = a + 1; b < n; ++b) {
      for (int e = 0; e < k; ++e) {
        x.push_back(attn[a * n + b] * f[a * n + b][e] * attn[b * n + a] * f[b * n + a][e]);
      }
    }
  }
  if (cfg.use_cvm) {
    for (int s = 0; s < cfg.slots; ++s) {
      x.push_back(std::log(slots[s][0] + 1));
      x.push_back(std::log(slots[s][1] + 1) - std::log(slots[s][0] + 1));
    }
  }
  for (std::size_t l = 0; l < cfg.fc_sizes.size(); ++l) {
    x = p.linear("fc_" + std::to_string(l), x, true);
    drop(l, false, i, x);
  }
  std::vector<double> out = p.linear("fc_" + std::to_string(cfg.fc_sizes.size()), x, false);
  drop(cfg.fc_sizes.size(), true, i, out);
  const double bias = p.has(kFatDeepffmBiasBlock) ? p(kFatDeepffmBiasBlock, 0) : 0.0;
  return first + out[0] + bias;
}

struct FatCase {
  bool use_cvm;
  int dense_dim;
};
void PrintTo(const FatCase& c, std::ostream* os) {
  *os << (c.use_cvm ? "cvm" : "no cvm") << ", " << c.dense_dim << " dense features";
}

class FatDeepffmTest : public ::testing::TestWithParam<FatCase>, protected testing::OneCard {
 protected:
  DenseModelConfig config() const {
    DenseModelConfig cfg;
    cfg.kind = ModelKind::kFatDeepffm;
    cfg.slots = 3;
    cfg.dense_dim = GetParam().dense_dim;
    cfg.mf_dim = (cfg.slots + cfg.dense_dim) * 3;  // k = 3 per field
    cfg.fc_sizes = {5, 4};
    cfg.seed = 31;
    cfg.use_cvm = GetParam().use_cvm;
    return cfg;
  }
};

TEST_P(FatDeepffmTest, PredictionsAndGradientsMatchAFloat64Reference) {
  const DenseModelConfig cfg = config();
  DenseModel model(card_, cfg);
  const std::size_t checked = testing::check_batch_sizes(
      card_, model, 7 + cfg.use_cvm * 2 + cfg.dense_dim,
      [&](const testing::HostBatch& h, int64_t i, const testing::NamedParams& p,
          const std::vector<double>& rec) { return fat_deepffm_logit(cfg, h, i, p, rec); });
  EXPECT_GT(checked, 200u);
}

// PaddleRec's fat_deepffm at p > 0 (its folder's 0.5, and 0.2): forward, loss, every dense
// gradient (the undropped bias's: the sum of dL/dlogit, unmasked) and every pushed one against the
// float64 reference with the same masks, at batches 7 and 1. The bias ends the layout: the net at
// p = 0 is its prefix, whose last value is the DNN output's bias (the export folds it there).
TEST_P(FatDeepffmTest, DropoutAndTheUndroppedBiasMatchAFloat64Reference) {
  const DenseModel plain(card_, config());
  EXPECT_FALSE(plain.undropped_bias().has_value());
  const testing::NamedParams plain_blocks{plain.parameters().blocks(), {}};
  for (const float p : {0.5f, 0.2f}) {
    SCOPED_TRACE("dnn_dropout " + std::to_string(p));
    DenseModelConfig cfg = config();
    cfg.dnn_dropout = p;
    DenseModel model(card_, cfg);
    ASSERT_TRUE(model.dropout().drops_output());
    const std::optional<UndroppedBias> bias = model.undropped_bias();
    ASSERT_TRUE(bias.has_value());
    EXPECT_EQ(bias->before, plain.parameters().size());
    EXPECT_EQ(plain_blocks.block("fc_2.b").offset + 1, bias->before);
    EXPECT_EQ(model.parameters().size(), bias->at + 1);
    const testing::NamedParams blocks{model.parameters().blocks(), {}};
    EXPECT_EQ(blocks.block(kFatDeepffmBiasBlock).offset, bias->at);
    for (const int64_t batch : {7, 1}) {
      SCOPED_TRACE("batch " + std::to_string(batch));
      model.set_dropout_steps(0);
      const testing::DropoutReference drop{&model.dropout(), p, 1};
      EXPECT_GT(testing::check_against_reference(
                    card_, model, 60 + batch,
                    [&](const testing::HostBatch& h, int64_t i, const testing::NamedParams& w,
                        const std::vector<double>& rec) {
                      return fat_deepffm_logit(cfg, h, i, w, rec, drop);
                    },
                    batch),
                0u);
    }
  }
}

// Evaluation has no dropout: the net at p > 0 predicts what the net at p = 0 predicts with the
// undropped bias added to the DNN output's bias (what the export serves), after a training step.
TEST_P(FatDeepffmTest, EvaluationIsTheNetAtZeroWithTheBiasFoldedIntoTheOutputBias) {
  DenseModelConfig cfg = config();
  cfg.dnn_dropout = 0.5f;
  DenseModel dropped(card_, cfg);
  DenseModel plain(card_, config());
  std::mt19937_64 rng(5);
  const testing::HostBatch h = testing::make_field_batch(9, cfg, rng);
  const testing::CardBatch batch(card_, h, cfg.slots);
  std::vector<float> w = dropped.parameters().values_to_host();
  const UndroppedBias bias = dropped.undropped_bias().value();
  w[bias.at] = 0.75f;  // trained away from 0
  dropped.parameters().set_values(w);
  auto push = card_.make_buffer<float>(h.offsets.back() * dropped.pool().push_dim());
  dropped.forward_backward(batch.view, GradScales{1.0f / 9, 1.0f}, push.data());
  w = dropped.parameters().values_to_host();
  std::vector<float> folded(w.begin(), w.begin() + static_cast<std::ptrdiff_t>(bias.before));
  folded.back() += w[bias.at];
  plain.parameters().set_values(folded);
  dropped.predict(batch.view);
  plain.predict(batch.view);
  const std::vector<float> want = device::to_host(plain.predictions(), 9, card_.stream());
  const std::vector<float> got = device::to_host(dropped.predictions(), 9, card_.stream());
  for (int i = 0; i < 9; ++i) EXPECT_NEAR(got[i], want[i], 1e-6) << "instance " << i;
}

// dense_w's gradient sums the batch in chunks (FatDeepffmPart::dense_w_chunk_rows): one chunk
// (16 instances), one instance past it (2 chunks), the most chunks (64 of 16) and one instance past
// them (61 chunks of 17, the last of 5), each value against central differences of the float64
// reference.
TEST_P(FatDeepffmTest, DenseWGradientAtTheChunkEdges) {
  const DenseModelConfig cfg = config();
  if (cfg.dense_dim == 0) GTEST_SKIP() << "no dense features, no dense_w";
  DenseModel model(card_, cfg);
  const int64_t rows = FatDeepffmPart::kDenseWGradChunkRows;
  const int64_t most = rows * FatDeepffmPart::kDenseWGradChunks;
  const auto values = static_cast<std::size_t>(cfg.dense_dim) * cfg.mf_dim;  // D x N x k
  for (const int64_t batch : {rows, rows + 1, most, most + 1}) {
    SCOPED_TRACE("batch " + std::to_string(batch));
    EXPECT_EQ(
        testing::check_against_reference(
            card_, model, 40 + batch,
            [&](const testing::HostBatch& h, int64_t i, const testing::NamedParams& p,
                const std::vector<double>& rec) { return fat_deepffm_logit(cfg, h, i, p, rec); },
            batch, "fat_deepffm.dense_w"),
        values);
  }
}

// The blocks: CEN's two N^2 x N^2 layers, the dense features' vectors (D x N x k) and the DNN
// over the pairs' products (P k columns, + 2 per slot with cvm); no wide part.
TEST_P(FatDeepffmTest, ShapesAndFlops) {
  const DenseModelConfig cfg = config();
  DenseModel model(card_, cfg);
  const int n = cfg.slots + cfg.dense_dim, cells = n * n, pairs = n * (n - 1) / 2;
  std::vector<std::string> names;
  for (const ParamBlock& b : model.parameters().blocks()) names.push_back(b.name);
  std::vector<std::string> expected = {"fc_0.w",     "fc_0.b",    "fc_1.w",     "fc_1.b",
                                       "fc_2.w",     "fc_2.b",    "cen.fc_0.w", "cen.fc_0.b",
                                       "cen.fc_1.w", "cen.fc_1.b"};
  if (cfg.dense_dim > 0) expected.push_back("fat_deepffm.dense_w");
  std::sort(names.begin(), names.end());
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(names, expected);
  const testing::NamedParams blocks{model.parameters().blocks(), {}};
  const int dnn_in = pairs * 3 + (cfg.use_cvm ? 2 * cfg.slots : 0);
  EXPECT_EQ(blocks.block("fc_0.w").count, static_cast<std::size_t>(dnn_in * 5));
  EXPECT_EQ(blocks.block("cen.fc_1.w").count, static_cast<std::size_t>(cells * cells));
  if (cfg.dense_dim > 0) {
    EXPECT_EQ(blocks.block("fat_deepffm.dense_w").count,
              static_cast<std::size_t>(cfg.dense_dim * n * 3));
  }
  // The DNN's GEMMs (dx over the pairs' columns) and CEN's (dx over all), elementwise by hand.
  const double dnn = 2.0 * (5.0 * (2 * dnn_in + pairs * 3) + 4.0 * (2 * 5 + 5) + 1.0 * (2 * 4 + 4));
  const double cen = 2.0 * 2.0 * cells * 3.0 * cells;
  EXPECT_DOUBLE_EQ(model.flops_per_example(), dnn + cen + cells * 3 * 12.0 + 3.0 * pairs * 3);
}

// The part's launches per step do not grow with the batch (no item loops over it: the
// first-order sum is a GEMV, dense_w's gradient partial sums over chunks of it and a GEMV): the
// model's count less the same config's dnn's (whose loss reduction takes a launch more past 256
// instances) is the same at 8, 512 and 2048 instances.
TEST_P(FatDeepffmTest, LaunchesPerStepDoNotGrowWithTheBatch) {
  if (gemm_fallback_forced()) GTEST_SKIP() << testing::kCountsAssumeFusedGemms;
  const DenseModelConfig cfg = config();
  DenseModel model(card_, cfg);
  DenseModelConfig dnn_cfg = cfg;
  dnn_cfg.kind = ModelKind::kDnn;
  dnn_cfg.mf_dim = 3;
  DenseModel dnn(card_, dnn_cfg);
  const auto part = [&](int64_t batch) {
    return static_cast<int64_t>(testing::step_launches(card_, model, batch, 3)) -
           static_cast<int64_t>(testing::step_launches(card_, dnn, batch, 3));
  };
  // Measured when written: 11 more than the dnn, and 2 for dense_w's gradient (its chunks' partial
  // sums, their GEMV). An input-gradient GEMM whose ReLU mask the cpu runs after it ('relu mask
  // after' in the kernel report) masks in the GEMM's own launch, as cuBLASLt's epilogue does.
  const int64_t launches = 11 + (cfg.dense_dim > 0 ? 2 : 0);
  for (const int64_t batch : {8, 512, 2048}) EXPECT_EQ(part(batch), launches) << "batch " << batch;
}

INSTANTIATE_TEST_SUITE_P(FatDeepffm, FatDeepffmTest,
                         ::testing::Values(FatCase{false, 2}, FatCase{true, 2}, FatCase{false, 0}));

// A row width that is no whole number of factors per field is refused, naming the fields.
TEST(FatDeepffmRefusals, ARowWidthThatIsNoMultipleOfTheFieldsIsRefused) {
  device::CardSet cards = device::CardSet::from_list("0");
  cards.card(0).activate();
  DenseModelConfig cfg;
  cfg.kind = ModelKind::kFatDeepffm;
  cfg.slots = 3;
  cfg.dense_dim = 2;
  cfg.mf_dim = 8;  // 5 fields
  const std::string why = testing::refusal(cards.card(0), cfg);
  EXPECT_NE(why.find("3 sparse slots + 2 dense features = 5"), std::string::npos) << why;
}

}  // namespace
}  // namespace gpubox::trainer
