// Dropout (hyper_parameters.dnn_dropout, trainer/nn/dropout.hpp): the mask's drop fraction
// within a binomial bound; the dnn's forward, loss, dense and pushed gradients against a float64
// reference with the same mask (central differences of its summed log loss) at p 0, 0.2, 0.5 and
// 0.9 and at batch 1 and width 1; a new mask every step, a captured and replayed step equal to
// the eager one bit for bit; every card its own mask; evaluation untouched by it.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "heterps/device/card.hpp"
#include "heterps/device/step_graph.hpp"
#include "tests/trainer/dropout_reference.hpp"
#include "tests/trainer/field_model_check.hpp"
#include "tests/trainer/flen_reference.hpp"
#include "tests/trainer/one_card.hpp"
#include "trainer/nn/dense_model.hpp"
#include "trainer/nn/dropout.hpp"

namespace gpubox::trainer {
namespace {

DenseModelConfig dnn_config(float p, std::vector<int> fc_sizes = {5, 4}) {
  DenseModelConfig cfg;
  cfg.kind = ModelKind::kDnn;
  cfg.slots = 3;
  cfg.mf_dim = 2;
  cfg.dense_dim = 2;
  cfg.fc_sizes = std::move(fc_sizes);
  cfg.seed = 11;
  cfg.dnn_dropout = p;
  return cfg;
}

// The dnn's logit of instance i in float64 (no cvm): x0 = each slot's pooled embed_w and embedx,
// then the dense values; every hidden layer ReLU'd and dropped as `drop` says.
double dnn_logit(const DenseModelConfig& cfg, const testing::DropoutReference& drop,
                 const testing::HostBatch& h, int64_t i, const testing::NamedParams& p,
                 const std::vector<double>& rec) {
  std::vector<double> x;
  for (const std::vector<double>& sum : testing::pooled_slots(h, cfg, i, rec)) {
    x.insert(x.end(), sum.begin() + 2, sum.end());
  }
  for (int d = 0; d < cfg.dense_dim; ++d) x.push_back(h.dense[i * cfg.dense_dim + d]);
  for (std::size_t l = 0; l < cfg.fc_sizes.size(); ++l) {
    x = p.linear("fc_" + std::to_string(l), x, true);
    drop(l, false, i, x);
  }
  return p.linear("fc_" + std::to_string(cfg.fc_sizes.size()), x, false).at(0);
}

// The small flen both flen tests build: 5 slots in groups {2, 1, 2}, `fc_sizes` hidden layers.
DenseModelConfig flen_config(const std::vector<int>& fc_sizes, uint64_t seed, float p) {
  DenseModelConfig cfg;
  cfg.kind = ModelKind::kFlen;
  cfg.slots = 5;
  cfg.flen_groups = {2, 1, 2};
  cfg.mf_dim = 3;
  cfg.dense_dim = 2;
  cfg.fc_sizes = fc_sizes;
  cfg.seed = seed;
  cfg.dnn_dropout = p;
  return cfg;
}

class DropoutTest : public ::testing::Test, protected testing::OneCard {
 protected:
  // One mask's step state on the card at `step`: its key of the step written by the card's step
  // kernel (apply_dropout_async reads it at dropout_step_keys(state, 1)).
  device::device_buffer<uint64_t> state_at(const DropoutMask& mask, uint64_t step) {
    auto state = up(std::vector<uint64_t>{0, mask.layer_key, 0});
    set_dropout_step_async(card_.stream(), state.data(), 1, step);
    return state;
  }
  // One forward_backward of a seeded batch at dropout step 1, checked against the reference.
  std::size_t check(const DenseModelConfig& cfg, int64_t batch, uint64_t seed) {
    DenseModel model(card_, cfg);
    model.set_dropout_steps(0);
    const testing::DropoutReference drop{&model.dropout(), cfg.dnn_dropout, 1};
    return testing::check_against_reference(
        card_, model, seed,
        [&](const testing::HostBatch& h, int64_t i, const testing::NamedParams& p,
            const std::vector<double>& rec) { return dnn_logit(cfg, drop, h, i, p, rec); },
        batch);
  }
};

TEST_F(DropoutTest, DropFractionIsWithinABinomialBound) {
  const int64_t rows = 512;
  const int cols = 300;
  const int64_t ld = 304;
  for (const double p : {0.2, 0.5, 0.9}) {
    for (const bool hidden : {true, false}) {
      const double keep = hidden ? (1 - p) * (1 - p) : 1 - p;
      const DropoutMask mask = make_dropout_mask(3, 0, 1, keep);
      const auto state = state_at(mask, 7);
      std::vector<float> ones(rows * ld, 1.0f);
      auto y = up(ones);
      apply_dropout_async(card_.stream(), mask, dropout_step_keys(state.data(), 1), y.data(),
                          ElementType::kF32, rows, cols, ld);
      const std::vector<float> out = device::to_host(y);
      const uint64_t key = mask.step_key(7);
      double dropped = 0;
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < ld; ++c) {
          const float v = out[r * ld + c];
          if (c >= cols) {
            ASSERT_EQ(v, 1.0f) << "padding written";
            continue;
          }
          // The card's mask is the host's, unit for unit; a kept unit is scaled by 1/keep.
          const bool kept = mask.keeps(key, static_cast<uint64_t>(r * cols + c));
          ASSERT_EQ(v, kept ? static_cast<float>(1.0 / keep) : 0.0f) << r << "," << c;
          dropped += kept ? 0 : 1;
        }
      }
      const double n = static_cast<double>(rows * cols);
      const double sd = std::sqrt(n * keep * (1 - keep));
      EXPECT_NEAR(dropped, n * (1 - keep), 6 * sd) << "p " << p << (hidden ? " hidden" : " output");
    }
  }
}

// On a card of 3 threads the units split into parts that start and end inside rows (the cpu's
// row-by-row form): every unit is still the host mask's, the row padding untouched.
TEST(DropoutThreads, PartsStartingInsideARowDropTheHostMasksUnits) {
  device::CardSet cards = device::CardSet::from_list("0", 0, 1, 3);
  device::Card& card = cards.card(0);
  card.activate();
  const int64_t rows = 130, ld = 40;
  const int cols =
      37;  // 4,810 units: past the serial limit; parts end at 1,603 and 3,206 (mid-row)
  const DropoutMask mask = make_dropout_mask(9, 0, 2, 0.6);
  auto state =
      device::to_device(std::vector<uint64_t>{0, mask.layer_key, 0}, card.memory(), card.stream());
  set_dropout_step_async(card.stream(), state.data(), 1, 5);
  auto y = device::to_device(std::vector<float>(rows * ld, 2.0f), card.memory(), card.stream());
  apply_dropout_async(card.stream(), mask, dropout_step_keys(state.data(), 1), y.data(),
                      ElementType::kF32, rows, cols, ld);
  const std::vector<float> out = device::to_host(y);
  const uint64_t key = mask.step_key(5);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < ld; ++c) {
      const bool kept = c < cols && mask.keeps(key, static_cast<uint64_t>(r * cols + c));
      const float want = c >= cols ? 2.0f : kept ? 2.0f * mask.scale : 0.0f;
      ASSERT_EQ(out[r * ld + c], want) << r << "," << c;
    }
  }
}

// bf16 activations: the same units, the kept ones rounded to bf16 after the scale.
TEST_F(DropoutTest, Bf16UnitsAreTheFloatUnits) {
  const DropoutMask mask = make_dropout_mask(5, 1, 0, 0.64);
  const auto state = state_at(mask, 2);
  const int64_t rows = 33, ld = 24;
  const int cols = 17;
  std::vector<Bf16> values(rows * ld);
  for (std::size_t k = 0; k < values.size(); ++k) values[k] = to_bf16(0.5f + 0.01f * (k % 50));
  auto y = up(values);
  apply_dropout_async(card_.stream(), mask, dropout_step_keys(state.data(), 1), y.data(),
                      ElementType::kBf16, rows, cols, ld);
  const std::vector<Bf16> out = device::to_host(y);
  for (int64_t r = 0; r < rows; ++r) {
    for (int c = 0; c < ld; ++c) {
      const std::size_t at = r * ld + c;
      const bool kept = c >= cols || mask.keeps(mask.step_key(2), r * cols + c);
      const float want = c >= cols ? to_float(values[at]) : to_float(values[at]) * mask.scale;
      ASSERT_EQ(out[at].bits, to_bf16(kept ? want : 0.0f).bits) << r << "," << c;
    }
  }
}

// A NaN or inf stays non-finite whether kept or dropped (a dropped unit is y * 0, not 0): the
// non-finite check still sees it. fp32 and bf16.
TEST_F(DropoutTest, NonFiniteUnitsStayNonFiniteWhenDropped) {
  const DropoutMask mask = make_dropout_mask(5, 0, 0, 0.25);
  const auto state = state_at(mask, 3);
  const int rows = 16, cols = 8;
  const float specials[] = {std::nanf(""), INFINITY, -INFINITY};
  std::vector<float> values(rows * cols);
  std::vector<Bf16> halves(rows * cols);
  for (std::size_t k = 0; k < values.size(); ++k) {
    values[k] = specials[k % 3];
    halves[k] = to_bf16(values[k]);
  }
  auto y = up(values);
  auto y16 = up(halves);
  apply_dropout_async(card_.stream(), mask, dropout_step_keys(state.data(), 1), y.data(),
                      ElementType::kF32, rows, cols, cols);
  apply_dropout_async(card_.stream(), mask, dropout_step_keys(state.data(), 1), y16.data(),
                      ElementType::kBf16, rows, cols, cols);
  const std::vector<float> out = device::to_host(y);
  const std::vector<Bf16> out16 = device::to_host(y16);
  int dropped = 0;
  for (std::size_t k = 0; k < values.size(); ++k) {
    const bool kept = mask.keeps(mask.step_key(3), k);
    dropped += kept ? 0 : 1;
    EXPECT_FALSE(std::isfinite(out[k])) << k << (kept ? " kept" : " dropped");
    EXPECT_FALSE(std::isfinite(to_float(out16[k]))) << k << (kept ? " kept" : " dropped");
    if (!kept) {
      EXPECT_TRUE(std::isnan(out[k])) << k;
    }
  }
  EXPECT_GT(dropped, 0);
}

TEST_F(DropoutTest, ForwardAndGradientsMatchFloat64ReferenceWithTheSameMask) {
  std::size_t checked = 0;
  for (const float p : {0.0f, 0.2f, 0.5f, 0.9f}) {
    SCOPED_TRACE("p " + std::to_string(p));
    checked += check(dnn_config(p), 6, 101);
  }
  EXPECT_GT(checked, 400u);
}

// PaddleRec's flen drops each DNN hidden unit three times (after the Linear, the ReLU and the batch
// norm, which is not built: keep (1-p)^3) and its bi-interaction's ReLU'd layer once (keep 1-p,
// the side mask), not the logit: forward, loss, dense and pushed gradients against the float64
// reference with the same masks, with and without hidden layers, at batches 7 and 1.
TEST_F(DropoutTest, FlenDropsItsDnnThriceAndItsBiInteractionLayer) {
  for (const std::vector<int>& fc_sizes : {std::vector<int>{6, 4}, std::vector<int>{}}) {
    for (const float p : {0.2f, 0.5f}) {
      SCOPED_TRACE("p " + std::to_string(p) + ", hidden layers " + std::to_string(fc_sizes.size()));
      const DenseModelConfig cfg = flen_config(fc_sizes, 41, p);
      DenseModel model(card_, cfg);
      ASSERT_TRUE(model.dropout().drops_side());
      ASSERT_FALSE(model.dropout().drops_output());
      const double hidden_keep = std::pow(1.0 - p, 3);
      if (!fc_sizes.empty()) {
        EXPECT_NEAR(1.0 / model.dropout().mask(0).scale, hidden_keep, 1e-7);
      }
      for (const int64_t batch : {7, 1}) {
        model.set_dropout_steps(0);
        testing::DropoutReference drop{&model.dropout(), p, 1};
        drop.hidden_dropouts = 3;
        testing::check_against_reference(
            card_, model, 90 + batch,
            [&](const testing::HostBatch& h, int64_t i, const testing::NamedParams& w,
                const std::vector<double>& rec) {
              return testing::flen_logit(cfg, h, i, w, rec, drop);
            },
            batch);
      }
    }
  }
}

// The masks' bits, pinned as drawn before the step keys moved into the step counter's kernel
// (a hidden layer's, the output's and the side layer's, steps 1 and 2, 64 units each): a change
// of the hash, the key or where it is computed that moves a bit fails here.
TEST_F(DropoutTest, MaskBitsArePinned) {
  MlpDropoutShape shape;
  shape.hidden = 1;
  shape.hidden_dropouts = 3;
  shape.output = true;
  shape.side = true;
  MlpDropout drop(card_, 0.5, 11, shape);
  std::vector<uint64_t> bits;
  for (int step = 1; step <= 2; ++step) {
    drop.begin_step(card_.stream());
    for (int layer = 0; layer < 3; ++layer) {
      auto y = up(std::vector<float>(64, 1.0f));
      if (layer == 0)
        drop.hidden_forward(card_.stream(), 0, y.data(), ElementType::kF32, 1, 64, 64);
      if (layer == 1) drop.output_forward(card_.stream(), y.data(), 64);
      if (layer == 2) drop.side_forward(card_.stream(), y.data(), 1, 64, 64);
      const std::vector<float> out = device::to_host(y);
      uint64_t kept = 0;
      for (int i = 0; i < 64; ++i) kept |= static_cast<uint64_t>(out[i] != 0.0f) << i;
      bits.push_back(kept);
    }
  }
  // Hidden (keep 0.125), output, side (keep 0.5) at step 1, then at step 2.
  EXPECT_EQ(bits, (std::vector<uint64_t>{0x2001800404000018ull, 0x4613598a30b0f0d5ull,
                                         0x1dfaa4e8751dad1cull, 0x0004050501040800ull,
                                         0x1c4db66e53001492ull, 0x88ae70f489c967ecull}));
}

TEST_F(DropoutTest, EdgeSizesBatchOneWidthOneRateNearOne) {
  check(dnn_config(0.5f), 1, 7);             // batch 1
  check(dnn_config(0.5f, {1, 1}), 6, 8);     // width 1
  check(dnn_config(0.9f, {1}), 9, 9);        // p 0.9: keep 0.01
  check(dnn_config(0.9f, {24, 8}), 12, 10);  // p 0.9 over more units (some kept)
}

// One dnn step's dense gradients (forward_backward_async, synchronized).
std::vector<float> step_grads(device::Card& card, DenseModel& model, const DenseBatchView& view,
                              float* push) {
  model.forward_backward_async(view, GradScales{1.0f / 8, 1.0f}, push);
  card.stream().synchronize();
  return model.parameters().grads_to_host();
}

TEST_F(DropoutTest, ReplayedStepEqualsEagerAndDrawsANewMaskEachStep) {
  const DenseModelConfig cfg = dnn_config(0.5f, {16, 8});
  std::mt19937_64 rng(5);
  const testing::HostBatch h = testing::make_field_batch(8, cfg, rng);
  const testing::CardBatch batch(card_, h, cfg.slots);
  DenseModel eager(card_, cfg), replayed(card_, cfg);
  auto push = card_.make_buffer<float>(h.offsets.back() * eager.pool().push_dim());
  const std::vector<float> first = step_grads(card_, eager, batch.view, push.data());
  const std::vector<float> second = step_grads(card_, eager, batch.view, push.data());
  EXPECT_NE(first, second) << "the same mask twice (no optimizer step in between)";

  replayed.reserve(8);
  device::StepGraph graph("dropout step");
  graph.capture(card_.stream(), [&] {
    replayed.forward_backward_async(batch.view, GradScales{1.0f / 8, 1.0f}, push.data());
  });
  for (const std::vector<float>* eager_grads : {&first, &second}) {
    graph.replay(card_.stream());
    card_.stream().synchronize();
    EXPECT_EQ(replayed.parameters().grads_to_host(), *eager_grads);
  }
}

TEST_F(DropoutTest, EveryCardDrawsItsOwnMaskReproducibly) {
  const DenseModelConfig cfg = dnn_config(0.5f, {16, 8});
  std::mt19937_64 rng(6);
  const testing::HostBatch h = testing::make_field_batch(8, cfg, rng);
  std::vector<std::vector<float>> grads;
  for (const int trainer : {0, 1, 0}) {
    // One card of trainer `trainer` of 2: global rank 0 or 1.
    device::CardSet cards = device::CardSet::from_list("0", trainer, 2);
    device::Card& card = cards.card(0);
    card.activate();
    ASSERT_EQ(card.rank(), trainer);
    const testing::CardBatch batch(card, h, cfg.slots);
    DenseModel model(card, cfg);
    auto push = card.make_buffer<float>(h.offsets.back() * model.pool().push_dim());
    grads.push_back(step_grads(card, model, batch.view, push.data()));
  }
  card_.activate();
  EXPECT_NE(grads[0], grads[1]) << "two cards dropped the same units";
  EXPECT_EQ(grads[0], grads[2]) << "the same card, seed and step drew another mask";
}

TEST_F(DropoutTest, EvaluationIsTheNetWithoutDropout) {
  std::mt19937_64 rng(7);
  const DenseModelConfig with = dnn_config(0.5f, {16, 8});
  const testing::HostBatch h = testing::make_field_batch(8, with, rng);
  const testing::CardBatch batch(card_, h, with.slots);
  DenseModel dropped(card_, with), plain(card_, dnn_config(0.0f, {16, 8}));
  ASSERT_TRUE(dropped.dropout().on());
  ASSERT_FALSE(plain.dropout().on());
  ASSERT_EQ(dropped.parameters().values_to_host(), plain.parameters().values_to_host());
  auto push = card_.make_buffer<float>(h.offsets.back() * plain.pool().push_dim());
  // A training step first (it drops), then predictions: the same as the plain net's.
  const std::vector<float> train_preds = [&] {
    step_grads(card_, dropped, batch.view, push.data());
    return device::to_host(dropped.predictions(), 8, card_.stream());
  }();
  dropped.predict(batch.view);
  plain.predict(batch.view);
  const std::vector<float> eval = device::to_host(dropped.predictions(), 8, card_.stream());
  EXPECT_EQ(eval, device::to_host(plain.predictions(), 8, card_.stream()));
  EXPECT_NE(eval, train_preds) << "training predictions should carry the mask";
}

// flen's evaluation and prediction do not drop its bi-interaction's layer either (the side mask
// is a training forward's): with no hidden layer only that mask could differ, and with hidden
// layers both: the same predictions as the net at p 0 with the same parameters.
TEST_F(DropoutTest, FlenEvaluationAppliesNoBiInteractionMask) {
  for (const std::vector<int>& fc_sizes : {std::vector<int>{}, std::vector<int>{6, 4}}) {
    SCOPED_TRACE("hidden layers " + std::to_string(fc_sizes.size()));
    const auto flen = [&](float p) { return flen_config(fc_sizes, 43, p); };
    std::mt19937_64 rng(8);
    const testing::HostBatch h = testing::make_field_batch(8, flen(0.5f), rng);
    const testing::CardBatch batch(card_, h, 5);
    DenseModel dropped(card_, flen(0.5f)), plain(card_, flen(0.0f));
    ASSERT_TRUE(dropped.dropout().drops_side());
    ASSERT_EQ(dropped.parameters().values_to_host(), plain.parameters().values_to_host());
    auto push = card_.make_buffer<float>(h.offsets.back() * plain.pool().push_dim());
    step_grads(card_, dropped, batch.view, push.data());  // a training step draws step 1's masks
    const std::vector<float> train_preds =
        device::to_host(dropped.predictions(), 8, card_.stream());
    dropped.predict(batch.view);
    plain.predict(batch.view);
    const std::vector<float> eval = device::to_host(dropped.predictions(), 8, card_.stream());
    EXPECT_EQ(eval, device::to_host(plain.predictions(), 8, card_.stream()));
    EXPECT_NE(eval, train_preds) << "training predictions should carry the masks";
  }
}

// p = 0 is today's net: no dropout work in the step (p > 0 adds the step counter's advance and one
// launch per hidden layer; on CUDA also one per layer reading a dropped output, fc_1 and fc_2 here:
// its input gradient is the GEMM and then the x > 0 mask kernel, where the net without dropout
// fuses them in cuBLASLt's DRELU epilogue; oneDNN masks by its input either way).
TEST_F(DropoutTest, ZeroRateAddsNoWorkToTheStep) {
  if (gemm_fallback_forced()) GTEST_SKIP() << testing::kCountsAssumeFusedGemms;
  DenseModel plain(card_, dnn_config(0.0f, {16, 8})), dropped(card_, dnn_config(0.5f, {16, 8}));
  EXPECT_FALSE(plain.dropout().on());
#if defined(GPUBOX_BACKEND_CUDA)
  const uint64_t added = 3 + 2;
#else
  const uint64_t added = 3;
#endif
  EXPECT_EQ(testing::step_launches(card_, plain, 8, 3) + added,
            testing::step_launches(card_, dropped, 8, 3));
}

TEST_F(DropoutTest, RateOutsideZeroTo0999OrWithBatchNormIsRefused) {
  DenseModel highest(card_, dnn_config(0.999f));
  EXPECT_GT(highest.dropout().mask(0).keep_below, 0u);
  // At most 0.999: nearer 1 the hidden keep (1-p)^2 rounds toward 0 (check_dnn_dropout).
  for (const float p : {-0.1f, 1.0f, 0.9995f}) {
    EXPECT_NE(testing::refusal(card_, dnn_config(p)).find("hyper_parameters.dnn_dropout"),
              std::string::npos);
  }
  // flen's hidden keep (1-p)^3 at least 2^-20 (kMinDropoutKeep): 0.99 built, 0.995 refused.
  DenseModelConfig flen = dnn_config(0.99f);
  flen.kind = ModelKind::kFlen;
  flen.slots = 5;
  flen.flen_groups = {2, 1, 2};
  DenseModel flen_highest(card_, flen);
  EXPECT_GE(flen_highest.dropout().mask(0).keep_below, 4096u);
  flen.dnn_dropout = 0.995f;
  EXPECT_NE(testing::refusal(card_, flen).find("hyper_parameters.dnn_dropout 0.995"),
            std::string::npos)
      << testing::refusal(card_, flen);
  DenseModelConfig norm = dnn_config(0.2f);
  norm.batch_norm = true;
  EXPECT_NE(testing::refusal(card_, norm).find("dnn_batch_norm"), std::string::npos);
}

}  // namespace
}  // namespace gpubox::trainer
