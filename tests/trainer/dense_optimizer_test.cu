// Dense Adam, SGD and Adagrad against a float64 reference over several steps; the finite check.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "heterps/device/card.hpp"
#include "heterps/heter_comm/heter_comm_types.hpp"
#include "tests/trainer/test_util.hpp"
#include "trainer/nn/bf16.hpp"
#include "trainer/nn/dense_optimizer.hpp"
#include "trainer/nn/layers.hpp"

namespace gpubox::trainer {
namespace {

struct Reference {
  std::vector<double> w, m, v;
  int64_t t = 0;
  void step(const DenseOptimizerConfig& c, const std::vector<float>& g) {
    ++t;
    for (std::size_t i = 0; i < w.size(); ++i) {
      if (c.kind == DenseOptimizerKind::kSgd) {
        w[i] -= c.learning_rate * static_cast<double>(g[i]);
        continue;
      }
      if (c.kind == DenseOptimizerKind::kAdagrad) {  // Paddle's adagrad (v: the g^2 sum)
        if (t == 1) v[i] = c.initial_accumulator;
        v[i] += static_cast<double>(g[i]) * g[i];
        w[i] -= c.learning_rate * g[i] / (std::sqrt(v[i]) + c.epsilon);
        continue;
      }
      m[i] = c.beta1 * m[i] + (1.0 - c.beta1) * g[i];
      v[i] = c.beta2 * v[i] + (1.0 - c.beta2) * static_cast<double>(g[i]) * g[i];
      const double b1 = std::pow(static_cast<double>(c.beta1), t);
      const double b2 = std::pow(static_cast<double>(c.beta2), t);
      const double m_hat = m[i] / (1 - b1);
      const double v_hat = v[i] / (1 - b2);
      w[i] -= c.learning_rate * m_hat / (std::sqrt(v_hat) + c.epsilon);
    }
  }
};

class DenseOptimizerTest : public ::testing::TestWithParam<std::tuple<DenseOptimizerKind, int>> {};

TEST_P(DenseOptimizerTest, MatchesFloat64Reference) {
  const auto [kind, n] = GetParam();
  device::CardSet cards = device::CardSet::from_list("0");
  device::Card& card = cards.card(0);
  card.activate();
  DenseOptimizerConfig config;
  config.kind = kind;
  config.learning_rate = kind == DenseOptimizerKind::kAdam ? 0.01f : 0.1f;
  if (kind == DenseOptimizerKind::kAdagrad) {  // PaddleRec flen's settings
    config.learning_rate = 0.04f;
    config.epsilon = 1e-6f;
    config.initial_accumulator = 1e-3f;
  }
  std::mt19937_64 rng(n + static_cast<int>(kind));
  std::vector<float> w = testing::random_vector(n, rng);
  Reference ref{std::vector<double>(w.begin(), w.end()), std::vector<double>(n, 0.0),
                std::vector<double>(n, 0.0)};
  auto values = device::to_device(w, card.memory(), card.stream());
  auto grads = card.make_buffer<float>(n);
  DenseOptimizer opt(card, config, n);
  // Even steps also write the weights' bf16 copy (the bf16 GEMMs' operand), odd ones do not.
  auto copy_bf16 = card.make_buffer<Bf16>(n);
  for (int step = 0; step < 25; ++step) {
    // Gradients of mixed magnitudes (and exact zeros) so epsilon and the bias correction matter.
    std::vector<float> g = testing::random_vector(n, rng, -2.0f, 2.0f);
    for (int i = 0; i < n; i += 7) g[i] = 0.0f;
    for (int i = 3; i < n; i += 11) g[i] *= 1e-4f;
    if (n > 0) device::copy_async(grads.data(), g.data(), n, card.stream());
    opt.step(values.data(), grads.data(), step % 2 == 0 ? copy_bf16.data() : nullptr);
    ref.step(config, g);
  }
  EXPECT_EQ(opt.steps(), 25);
  const std::vector<float> got = device::to_host(values);
  const std::vector<Bf16> got_bf16 = device::to_host(copy_bf16);
  for (int i = 0; i < n; ++i) {
    ASSERT_NEAR(got[i], ref.w[i], 1e-5 + 1e-5 * std::fabs(ref.w[i])) << "parameter " << i;
    ASSERT_EQ(got_bf16[i].bits, to_bf16(got[i]).bits) << "bf16 copy of parameter " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(KindsAndSizes, DenseOptimizerTest,
                         ::testing::Combine(::testing::Values(DenseOptimizerKind::kAdam,
                                                              DenseOptimizerKind::kSgd,
                                                              DenseOptimizerKind::kAdagrad),
                                            ::testing::Values(0, 1, 2047, 2049)));

#if !defined(GPUBOX_BACKEND_CUDA)
// Adam in float, each operation rounded on its own (this file is built for the baseline ISA,
// where nothing can fuse a multiply and an add): the cpu backend's clones for wider ISAs
// (dense_optimizer.cu) must give these bits, on whichever ISA the machine runs. cpu only: nvcc
// fuses the card's multiply-adds (no --fmad=false), so a card's Adam is near these bits, not on
// them (MatchesFloat64Reference covers it there).
TEST(DenseOptimizer, AdamEqualsFloatOperationsBitForBit) {
  device::CardSet cards = device::CardSet::from_list("0");
  device::Card& card = cards.card(0);
  card.activate();
  DenseOptimizerConfig config;
  config.kind = DenseOptimizerKind::kAdam;
  config.learning_rate = 0.01f;
  const int n = 2049;  // past the serial loop's limit; a tail past any vector width
  std::mt19937_64 rng(5);
  std::vector<float> w = testing::random_vector(n, rng);
  std::vector<float> m(n, 0.0f), v(n, 0.0f);
  auto values = device::to_device(w, card.memory(), card.stream());
  auto grads = card.make_buffer<float>(n);
  auto copy_bf16 = card.make_buffer<Bf16>(n);
  DenseOptimizer opt(card, config, n);
  for (int t = 1; t <= 6; ++t) {
    std::vector<float> g = testing::random_vector(n, rng, -2.0f, 2.0f);
    for (int i = 0; i < n; i += 5) g[i] *= 1e-5f;
    device::copy_async(grads.data(), g.data(), n, card.stream());
    opt.step(values.data(), grads.data(), copy_bf16.data());
    const double correction = std::sqrt(1.0 - std::pow(static_cast<double>(config.beta2), t));
    const auto lr_t = static_cast<float>(config.learning_rate * correction /
                                         (1.0 - std::pow(static_cast<double>(config.beta1), t)));
    const auto eps_hat = static_cast<float>(config.epsilon * correction);
    for (int i = 0; i < n; ++i) {
      m[i] = config.beta1 * m[i] + (1.0f - config.beta1) * g[i];
      v[i] = config.beta2 * v[i] + (1.0f - config.beta2) * g[i] * g[i];
      w[i] = w[i] - lr_t * m[i] / (std::sqrt(v[i]) + eps_hat);
    }
  }
  const std::vector<float> got = device::to_host(values);
  const std::vector<Bf16> got_bf16 = device::to_host(copy_bf16);
  for (int i = 0; i < n; ++i) {
    ASSERT_EQ(got[i], w[i]) << "parameter " << i;
    ASSERT_EQ(got_bf16[i].bits, to_bf16(w[i]).bits) << "bf16 copy of parameter " << i;
  }
  EXPECT_EQ(device::to_host(opt.moment1()), m);
  EXPECT_EQ(device::to_host(opt.moment2()), v);
}
#endif

// The training step's veto (issue 31, item 2: the finite verdict stays on the card): a step whose
// veto word is not kNoVeto changes neither the weights nor the moments; with kNoVeto it steps.
TEST(DenseOptimizer, AVetoedStepChangesNothing) {
  device::CardSet cards = device::CardSet::from_list("0");
  device::Card& card = cards.card(0);
  card.activate();
  for (const auto kind :
       {DenseOptimizerKind::kAdam, DenseOptimizerKind::kSgd, DenseOptimizerKind::kAdagrad}) {
    DenseOptimizerConfig config;
    config.kind = kind;
    config.learning_rate = 0.1f;
    const std::vector<float> w = {1.0f, -2.0f, 3.0f};
    auto values = device::to_device(w, card.memory(), card.stream());
    auto grads =
        device::to_device(std::vector<float>{0.5f, 0.25f, -1.0f}, card.memory(), card.stream());
    auto veto = device::to_device(std::vector<uint32_t>{1u}, card.memory(), card.stream());
    DenseOptimizer opt(card, config, w.size());
    opt.step(values.data(), grads.data(), nullptr, veto.data());
    EXPECT_EQ(device::to_host(values), w);
    if (kind == DenseOptimizerKind::kAdam) {
      EXPECT_EQ(device::to_host(opt.moment1()), std::vector<float>(3, 0.0f));
      EXPECT_EQ(device::to_host(opt.moment2()), std::vector<float>(3, 0.0f));
    }
    if (kind == DenseOptimizerKind::kAdagrad) {
      EXPECT_EQ(device::to_host(opt.moment2()), std::vector<float>(3, config.initial_accumulator));
    }
    veto =
        device::to_device(std::vector<uint32_t>{heter_comm::kNoVeto}, card.memory(), card.stream());
    opt.step(values.data(), grads.data(), nullptr, veto.data());
    const std::vector<float> stepped = device::to_host(values);
    for (std::size_t i = 0; i < w.size(); ++i) EXPECT_NE(stepped[i], w[i]) << i;
  }
}

// The step's finite check (find_non_finite_async, layers.hpp): the first index holding an inf
// or a NaN, kNoVeto when there is none; bad values at the ends, in the middle, several (the
// first wins, whichever thread finds which), at the serial and parallel sizes.
TEST(DenseOptimizer, FiniteCheckFindsTheFirstNonFiniteValue) {
  device::CardSet cards = device::CardSet::from_list("0");
  device::Card& card = cards.card(0);
  card.activate();
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  auto first_bad = card.make_buffer<uint32_t>(1);
  for (std::size_t n : {0, 1, 2047, 2049, 10000}) {
    std::mt19937_64 rng(n);
    const std::vector<float> finite = testing::random_vector(n, rng, -1e30f, 1e30f);
    std::vector<std::vector<std::size_t>> plants = {{}};
    if (n > 0) plants.insert(plants.end(), {{0}, {n - 1}, {n / 2}, {n - 1, n / 3, n / 2}});
    for (const auto& plant : plants) {
      for (float bad : {inf, -inf, nan}) {
        std::vector<float> values = finite;
        for (std::size_t at : plant) values[at] = bad;
        auto on_card = device::to_device(values, card.memory(), card.stream());
        find_non_finite_async(card.stream(), on_card.data(), n, first_bad.data());
        const uint32_t want =
            plant.empty() ? heter_comm::kNoVeto
                          : static_cast<uint32_t>(*std::min_element(plant.begin(), plant.end()));
        ASSERT_EQ(device::to_host(first_bad)[0], want) << n << " values, bad " << bad;
      }
    }
  }
}

TEST(DenseOptimizer, RejectsBadSettings) {
  device::CardSet cards = device::CardSet::from_list("0");
  DenseOptimizerConfig config;
  config.learning_rate = 0.0f;
  EXPECT_THROW(DenseOptimizer(cards.card(0), config, 4), Error);
  config.learning_rate = 0.1f;
  config.beta1 = 1.0f;
  EXPECT_THROW(DenseOptimizer(cards.card(0), config, 4), Error);
}

}  // namespace
}  // namespace gpubox::trainer
