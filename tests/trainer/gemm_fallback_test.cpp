// The fused GEMMs' fallback (trainer/nn/gemm_fallback.hpp), backend-neutral parts: which of the
// heuristic's candidates runs, the once-only log, the switch that forces the fallback
// (GPUBOX_FORCE_GEMM_FALLBACK), and the element-wise kernels that do the epilogues' work after a
// plain GEMM, against naive loops (fp32 and bf16, padded row strides).
#include "trainer/nn/gemm_fallback.hpp"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "heterps/device/card.hpp"
#include "heterps/device/memory.hpp"
#include "trainer/nn/bf16.hpp"

namespace gpubox::trainer {
namespace {

TEST(GemmFallback, TheFirstCandidateThatPassedItsCheckRuns) {
  EXPECT_EQ(first_usable_algorithm({}), -1) << "no candidate: the plain GEMM";
  EXPECT_EQ(first_usable_algorithm({false, false}), -1);
  EXPECT_EQ(first_usable_algorithm({true, true}), 0);
  EXPECT_EQ(first_usable_algorithm({false, true, true}), 1) << "another algorithm";
}

TEST(GemmFallback, EachFallbackIsLoggedOncePerProcess) {
  EXPECT_TRUE(log_fallback_once("test_layer forward", "test: forward falls back"));
  EXPECT_FALSE(log_fallback_once("test_layer forward", "test: forward falls back"));
  EXPECT_TRUE(log_fallback_once("test_layer input gradient", "test: input gradient falls back"));
}

// GPUBOX_FORCE_GEMM_FALLBACK: 1 forces the plain GEMMs (said once per process); unset, empty and
// 0 do not; another value is an error naming the variable. Restores the variable's value.
TEST(GemmFallback, TheForcingVariableIsOneOrOffAndIsLoggedOnce) {
  constexpr const char* kName = "GPUBOX_FORCE_GEMM_FALLBACK";
  const char* old = std::getenv(kName);
  const std::string saved = old != nullptr ? old : "";
  ::unsetenv(kName);
  EXPECT_FALSE(gemm_fallback_forced()) << "unset";
  for (const char* off : {"", "0"}) {
    ::setenv(kName, off, 1);
    EXPECT_FALSE(gemm_fallback_forced()) << "'" << off << "'";
  }
  ::setenv(kName, "1", 1);
  EXPECT_TRUE(gemm_fallback_forced());
  EXPECT_TRUE(gemm_fallback_forced()) << "read at each call";
  EXPECT_FALSE(log_fallback_once(kName, "test: logged again")) << "the switch was not logged";
  for (const char* bad : {"yes", "2", "true"}) {
    ::setenv(kName, bad, 1);
    try {
      gemm_fallback_forced();
      ADD_FAILURE() << kName << "=" << bad << " was taken";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::string(kName) + "=" + bad + ": 1 runs every"),
                std::string::npos)
          << e.what();
    }
  }
  if (old != nullptr) {
    ::setenv(kName, saved.c_str(), 1);
  } else {
    ::unsetenv(kName);
  }
}

// Rows of `cols` values with row stride `ld` (padding left at a marker the kernels must keep).
std::vector<float> random_rows(int64_t rows, int cols, int64_t ld, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> out(static_cast<std::size_t>(rows * ld), 7.0f);
  for (int64_t r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; ++c) out[static_cast<std::size_t>(r * ld + c)] = normal(rng);
  }
  return out;
}

TEST(GemmFallback, BiasAndReluMatchTheNaiveLoop) {
  device::CardSet cards = device::CardSet::from_list("0");
  device::Card& card = cards.card(0);
  std::mt19937 rng(3);
  const int64_t batch = 5;
  const int out = 3;
  const int64_t ld = 4;
  const std::vector<float> bias = {0.5f, -1.0f, 0.25f};
  for (bool relu : {false, true}) {
    const std::vector<float> y = random_rows(batch, out, ld, rng);
    auto on_card = device::to_device(y, card.memory(), card.stream());
    auto bias_on_card = device::to_device(bias, card.memory(), card.stream());
    add_bias_activation(on_card.data(), ElementType::kF32, ld, bias_on_card.data(), batch, out,
                        relu, card.stream());
    const std::vector<float> got = device::to_host(on_card);
    for (int64_t r = 0; r < batch; ++r) {
      for (int64_t c = 0; c < ld; ++c) {
        const std::size_t i = static_cast<std::size_t>(r * ld + c);
        float want = y[i];
        if (c < out) want = relu ? std::max(0.0f, y[i] + bias[c]) : y[i] + bias[c];
        EXPECT_EQ(got[i], want) << "row " << r << " col " << c << (relu ? " relu" : "");
      }
    }
  }
}

TEST(GemmFallback, MaskByReluInputZeroesWhereTheInputIsNotPositive) {
  device::CardSet cards = device::CardSet::from_list("0");
  device::Card& card = cards.card(0);
  std::mt19937 rng(4);
  const int64_t batch = 6;
  const int cols = 5;
  const int64_t dx_ld = 7;
  const int64_t x_ld = 8;
  const std::vector<float> dx = random_rows(batch, cols, dx_ld, rng);
  std::vector<float> x = random_rows(batch, cols, x_ld, rng);
  for (float& v : x) v = std::max(0.0f, v);  // a ReLU output: zeros and positives
  // bf16 input: the mask must read it as bf16.
  std::vector<Bf16> x_bf16(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) x_bf16[i] = to_bf16(x[i]);
  auto dx_card = device::to_device(dx, card.memory(), card.stream());
  auto x_card = device::to_device(x_bf16, card.memory(), card.stream());
  mask_by_relu_input(dx_card.data(), ElementType::kF32, dx_ld, x_card.data(), ElementType::kBf16,
                     x_ld, batch, cols, card.stream());
  const std::vector<float> got = device::to_host(dx_card);
  for (int64_t r = 0; r < batch; ++r) {
    for (int64_t c = 0; c < dx_ld; ++c) {
      const std::size_t i = static_cast<std::size_t>(r * dx_ld + c);
      const bool masked =
          c < cols && !(to_float(x_bf16[static_cast<std::size_t>(r * x_ld + c)]) > 0);
      EXPECT_EQ(got[i], masked ? 0.0f : dx[i]) << "row " << r << " col " << c;
    }
  }
}

}  // namespace
}  // namespace gpubox::trainer
