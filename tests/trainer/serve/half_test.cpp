// float16 conversion of the serving export, against exhaustive and float64 references.
#include "trainer/serve/half.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

namespace gpubox::trainer::serve {
namespace {

// Every binary16 value converts to float and back to itself (NaNs stay NaN).
TEST(Half, EveryHalfRoundTripsExactly) {
  for (uint32_t h = 0; h <= 0xffffu; ++h) {
    const uint16_t half = static_cast<uint16_t>(h);
    const float value = half_to_float(half);
    if (((h >> 10) & 0x1fu) == 0x1fu && (h & 0x3ffu) != 0) {
      EXPECT_TRUE(std::isnan(value)) << h;
      EXPECT_TRUE(std::isnan(half_to_float(float_to_half(value)))) << h;
      continue;
    }
    EXPECT_EQ(float_to_half(value), half) << "half 0x" << std::hex << h << " = " << value;
  }
  EXPECT_EQ(half_to_float(0x3c00), 1.0f);
  EXPECT_EQ(half_to_float(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(half_to_float(0x7bff), 65504.0f);               // largest finite
}

// float -> half is the nearest finite half (ties to the even mantissa), by a float64 search over
// every finite half; past the largest half by half an ulp, infinity.
TEST(Half, FloatToHalfIsTheNearestWithTiesToEven) {
  std::vector<std::pair<double, uint16_t>> halves;
  for (uint32_t h = 0; h < 0x7c00u; ++h) {  // finite non-negative halves, increasing
    halves.emplace_back(static_cast<double>(half_to_float(static_cast<uint16_t>(h))),
                        static_cast<uint16_t>(h));
  }
  auto reference = [&](float value) -> uint16_t {
    const uint16_t sign = std::signbit(value) ? 0x8000 : 0;
    const double v = std::fabs(static_cast<double>(value));
    if (v >= 65520.0) return sign | 0x7c00;  // 65504 + half an ulp (16) rounds to infinity
    auto above = std::lower_bound(halves.begin(), halves.end(), std::make_pair(v, uint16_t{0}));
    if (above == halves.end()) return sign | halves.back().second;  // (65504, 65520)
    if (above == halves.begin()) return sign | above->second;
    const auto below = above - 1;
    const double up = above->first - v, down = v - below->first;
    if (up < down || (up == down && (above->second & 1) == 0)) return sign | above->second;
    return sign | below->second;
  };
  std::mt19937 rng(17);
  std::uniform_real_distribution<float> exponent(-27.0f, 17.0f);
  for (int i = 0; i < 200000; ++i) {
    const float value = std::ldexp(1.0f + std::generate_canonical<float, 24>(rng),
                                   static_cast<int>(exponent(rng))) *
                        (i % 2 ? -1.0f : 1.0f);
    ASSERT_EQ(float_to_half(value), reference(value)) << value;
  }
  // Exact ties: 1 + 2^-11 lies between 1 and 1 + 2^-10 (odd): to 1; the next tie goes up.
  EXPECT_EQ(float_to_half(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  EXPECT_EQ(float_to_half(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  EXPECT_EQ(float_to_half(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(float_to_half(-0.0f), 0x8000);
  EXPECT_EQ(float_to_half(1e-9f), 0x0000);
}

}  // namespace
}  // namespace gpubox::trainer::serve
