// dlrm (DlrmPart, dot_interaction.cu) against a float64 reference written from the network's
// definition (PaddleRec's models/rank/dlrm net.py: bottom MLP, the upper triangle of the
// products among the slots' embeddings and the bottom output, the top MLP over both): its
// predictions, and every gradient (dense parameters and pulled values) against central
// differences of the reference's summed log loss; its shapes and flops; its refusals; bf16 near
// fp32.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/error.hpp"
#include "heterps/device/card.hpp"
#include "tests/heterps/device/test_cards.hpp"
#include "tests/trainer/field_model_check.hpp"
#include "tests/trainer/one_card.hpp"
#include "trainer/nn/blas.hpp"
#include "trainer/nn/dense_model.hpp"
#include "trainer/nn/dense_parameters.hpp"
#include "trainer/nn/dlrm_part.hpp"
#include "trainer/nn/layers.hpp"

namespace gpubox::trainer {
namespace {

// Instance i's logit in float64, from the parameter blocks by name.
double dlrm_logit(const DenseModelConfig& cfg, const testing::HostBatch& h, int64_t i,
                  const testing::NamedParams& p, const std::vector<double>& rec) {
  const int d = 1 + cfg.mf_dim;
  std::vector<double> x(h.dense.begin() + i * cfg.dense_dim,
                        h.dense.begin() + (i + 1) * cfg.dense_dim);
  for (std::size_t l = 0; l < cfg.bot_layer_sizes.size(); ++l) {
    x = p.linear("bot_" + std::to_string(l), x, true);
  }
  std::vector<std::vector<double>> t;
  std::vector<double> cvm;
  for (const std::vector<double>& sum : testing::pooled_slots(h, cfg, i, rec)) {
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
    r = p.linear("fc_" + std::to_string(l), r, l < cfg.fc_sizes.size());
  }
  return r.at(0);
}

#if !defined(GPUBOX_BACKEND_CUDA)
// (slots, d) pairs for the cpu backward's bit-for-bit test: every width with 3 slots, and every
// slot count (so every group size) at a width of one block and one of a block and a tail.
std::vector<std::pair<int, int>> slots_and_widths() {
  std::vector<std::pair<int, int>> cases;
  for (const int d : {15, 16, 17, 32, 33}) cases.emplace_back(3, d);
  for (const int slots : {4, 5, 6, 9}) {
    for (const int d : {16, 17}) cases.emplace_back(slots, d);
  }
  cases.emplace_back(9, 32);    // groups of 4 over two blocks
  cases.emplace_back(20, 16);   // the forward's pairs of feature 0 in a block and a part of one
  cases.emplace_back(26, 16);   // PaddleRec's dlrm: 27 features
  cases.emplace_back(130, 64);  // past the forward's column-major copy: its item-by-item form
  return cases;
}
#endif

class DenseModelFlops : public ::testing::Test, protected testing::OneCard {};

class DlrmTest : public ::testing::TestWithParam<bool>, protected testing::OneCard {
 protected:
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
};

TEST_P(DlrmTest, PredictionsAndGradientsMatchAFloat64Reference) {
  const DenseModelConfig cfg = config();
  DenseModel model(card_, cfg);
  const std::size_t checked = testing::check_batch_sizes(
      card_, model, cfg.use_cvm ? 41 : 42,
      [&](const testing::HostBatch& h, int64_t i, const testing::NamedParams& p,
          const std::vector<double>& rec) { return dlrm_logit(cfg, h, i, p, rec); });
  EXPECT_GT(checked, 300u);
}

// Vectors of d = 16, 17 and 21: the forward's dot products take four columns at a time
// (dot_interaction.cu), the cpu backward's blocks sixteen, so d = 21 has five groups and a tail
// of one, one block and a tail of five; the pool's work items two groups of fields.
TEST_P(DlrmTest, WideVectorsMatchAFloat64Reference) {
  for (const int d : {16, 17, 21}) {
    SCOPED_TRACE("d = " + std::to_string(d));
    DenseModelConfig cfg = config();
    cfg.mf_dim = d - 1;
    cfg.bot_layer_sizes = {5, d};
    DenseModel model(card_, cfg);
    const std::size_t checked = testing::check_batch_sizes(
        card_, model, cfg.use_cvm ? 43 : 44,
        [&](const testing::HostBatch& h, int64_t i, const testing::NamedParams& p,
            const std::vector<double>& rec) { return dlrm_logit(cfg, h, i, p, rec); });
    EXPECT_GT(checked, 300u);
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
  const std::string why = testing::refusal(card_, cfg);  // narrower than the embeddings
  EXPECT_NE(why.find("the last of hyper_parameters.bot_layer_sizes: 3"), std::string::npos) << why;
  EXPECT_NE(why.find("hyper_parameters.sparse_feature_dim: 4"), std::string::npos) << why;
  cfg = config();
  cfg.slot_dims = {3, 2, 3};
  EXPECT_THROW(DenseModel(card_, cfg), Error);
  cfg = config();
  cfg.dense_dim = 0;
  EXPECT_THROW(DenseModel(card_, cfg), Error);
}

// The cpu interaction forward (dot_interaction.cu: an instance's vectors copied column-major, 16
// pairs summed in register vectors, compiled per instruction set) against dot()'s scalar order,
// every pair bit for bit, with 4 to 27 features (a block of pairs and a part of one) and past the
// copy's size (131 features of 64: the item-by-item form). The backward (columns in register
// vectors of 16, then a tail summed in memory) against the scalar loop it replaces, in
// the same order: each column's sum from 0.0f over b = 0, 1, ... (f skipped), then times
// `unscale`. The pooled gradient bit for bit for d = 15, 16, 17, 32 and 33 (a tail alone, one
// block, one and a tail of one, two blocks, two and a tail of one); the cvm columns 0. The bottom
// output's gradient goes through the same sums. 3 to 6 and 9 slots (4 to 7 and 10 features): an
// instance's features summed in groups of 4 and then of 1, 2 or 3. cpu only: nvcc contracts the
// GPU form's multiply-adds.
TEST_P(DlrmTest, InteractionIsTheScalarLoopBitForBit) {
#if defined(GPUBOX_BACKEND_CUDA)
  GTEST_SKIP() << "the cpu backward's test";
#else
  std::mt19937_64 rng(29);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  const auto random = [&](std::size_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = value(rng);
    return v;
  };
  // On 1 thread a kernel's items come in one range; on 3 (a batch of 521) the forward's ranges
  // start and end inside an instance where 3 does not divide the features.
  for (const int threads : {1, 3}) {
    device::CardSet cards = device::CardSet::from_list("0", 0, 1, threads);
    device::Card& card = cards.card(0);
    card.activate();
    const auto up = [&](const std::vector<float>& host) {
      return device::to_device(host, card.memory(), card.stream());
    };
    for (const auto& [slots, d] : slots_and_widths()) {
      if (threads > 1 && slots > 30) continue;  // (the item-by-item form splits as any kernel)
      SCOPED_TRACE(std::to_string(threads) + " thread(s), slots " + std::to_string(slots) +
                   ", d = " + std::to_string(d));
      DenseModelConfig cfg = config();
      cfg.slots = slots;
      cfg.mf_dim = d - 1;
      cfg.bot_layer_sizes = {5, d};
      const SlotSumPool pool(cfg.slots, cfg.mf_dim, cfg.use_cvm);
      DenseParameters params(card);
      Blas blas(card);
      DlrmPart part(card, params, blas, pool, cfg, ElementType::kF32);
      params.finalize(cfg.seed);
      // (3 threads: enough items for the kernels to split, parallel_for's kSerialLoopLimit.)
      const int64_t batch = threads == 1 ? 7 : 521;
      const auto n = static_cast<std::size_t>(batch);
      part.reserve(batch);
      const int ld = pool.out_dim() + 3;  // the pool's rows, padded
      const std::vector<float> x0 = random(n * ld);
      const std::vector<float> dense = random(n * cfg.dense_dim);
      const std::vector<float> d_top = random(n * part.top_ld());
      const float unscale = 0.75f;
      auto x0_card = up(x0);
      auto dense_card = up(dense);
      auto d_pooled = up(std::vector<float>(n * pool.out_dim(), 9.0f));
      const InputRows rows{x0_card.data(), ld, ElementType::kF32};
      part.forward(card.stream(), params, rows, dense_card.data(), batch, true);
      auto d_top_card = up(d_top);
      device::copy_async(part.top_input_grad(), d_top_card.data(), d_top.size(), card.stream());
      part.backward(card.stream(), params, rows, batch, 1.0f, unscale, d_pooled.data());
      const std::vector<float> r = device::to_host(static_cast<const float*>(part.top_input()),
                                                   n * part.top_ld(), card.stream());
      const std::vector<float> got = to_host(d_pooled);
      const int features = part.features(), vc = pool.embed_w_column();
      const auto pair = [&](int a, int b) { return a * features - a * (a + 1) / 2 + (b - a - 1); };
      for (std::size_t i = 0; i < n; ++i) {
        const auto vector = [&](int b) {
          return b < cfg.slots ? &x0[i * ld + b * pool.width() + vc] : &r[i * part.top_ld()];
        };
        for (int a = 0; a < features; ++a) {  // the forward: dot()'s order, four partial sums
          for (int b = a + 1; b < features; ++b) {
            float lane[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            int k = 0;
            for (; k + 4 <= d; k += 4) {
              for (int j = 0; j < 4; ++j) lane[j] += vector(a)[k + j] * vector(b)[k + j];
            }
            float dot = (lane[0] + lane[2]) + (lane[1] + lane[3]);
            for (; k < d; ++k) dot += vector(a)[k] * vector(b)[k];
            const float got_dot = r[i * part.top_ld() + d + pair(a, b)];
            EXPECT_EQ(std::memcmp(&got_dot, &dot, sizeof dot), 0)
                << i << " pair " << a << " " << b << ": " << got_dot << " vs " << dot;
          }
        }
        const float* d_pairs = &d_top[i * part.top_ld() + d];
        for (int f = 0; f < cfg.slots; ++f) {
          const float* g = &got[i * pool.out_dim() + f * pool.width()];
          for (int c = 0; c < vc; ++c) EXPECT_EQ(g[c], 0.0f) << i << " " << f << " cvm " << c;
          for (int k = 0; k < d; ++k) {
            float sum = 0.0f;
            for (int b = 0; b < features; ++b) {
              if (b != f) sum += d_pairs[b < f ? pair(b, f) : pair(f, b)] * vector(b)[k];
            }
            sum *= unscale;
            EXPECT_EQ(std::memcmp(&g[vc + k], &sum, sizeof sum), 0)
                << i << " " << f << " " << k << ": " << g[vc + k] << " vs " << sum;
          }
        }
      }
    }
  }
#endif
}

// bf16 (GPUBOX_BF16_EMULATION where the CPU has no bf16 GEMMs): the bottom MLP, R and the
// interaction's vectors in bf16 stay within bf16's rounding of the fp32 model from the same
// weights: predictions, and every gradient as a whole (relative L2 error).
TEST_P(DlrmTest, Bf16StaysNearFp32) {
  testing::expect_bf16_near_fp32(card_, config(), 7, 0.05, 0.05);
}

INSTANTIATE_TEST_SUITE_P(Cvm, DlrmTest, ::testing::Bool());

}  // namespace
}  // namespace gpubox::trainer
