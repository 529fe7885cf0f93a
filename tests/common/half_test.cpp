// fp16 and bf16 conversion (common/half.hpp), against exhaustive and float64 references.
#include "common/half.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace gpubox {
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

// bf16 widens exactly: its bits are the float's upper half.
TEST(Bf16, EveryBf16RoundTripsExactly) {
  for (uint32_t b = 0; b <= 0xffffu; ++b) {
    const uint16_t bf16 = static_cast<uint16_t>(b);
    const float value = bf16_to_float(bf16);
    uint32_t bits = 0;
    std::memcpy(&bits, &value, sizeof(bits));
    EXPECT_EQ(bits, b << 16);
    if (std::isnan(value)) {
      EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(value)))) << b;
      continue;
    }
    EXPECT_EQ(float_to_bf16(value), bf16) << "bf16 0x" << std::hex << b << " = " << value;
  }
}

// float -> bf16 is the nearest bf16 (ties to the even mantissa), by a float64 reference on the
// two bf16 neighbours of each float; past the largest bf16 by half an ulp, infinity. Random
// floats over the whole exponent range (denormals included), then the edges.
TEST(Bf16, FloatToBf16IsTheNearestWithTiesToEven) {
  const double largest = static_cast<double>(bf16_to_float(0x7f7f));  // 3.3895e38
  const double overflow = largest + std::ldexp(1.0, 127 - 8);         // + half an ulp
  auto reference = [&](float value) -> uint16_t {
    uint32_t bits = 0;
    std::memcpy(&bits, &value, sizeof(bits));
    const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
    const double v = std::fabs(static_cast<double>(value));
    if (v >= overflow) return sign | 0x7f80;
    const uint16_t below = static_cast<uint16_t>((bits >> 16) & 0x7fffu);  // truncation
    const uint16_t above = static_cast<uint16_t>(below + 1);
    const double down = v - static_cast<double>(bf16_to_float(below));
    const double up = static_cast<double>(bf16_to_float(above)) - v;
    if (down < up || (down == up && (below & 1) == 0)) return sign | below;
    return sign | above;
  };
  std::mt19937 rng(23);
  for (int i = 0; i < 400000; ++i) {
    uint32_t bits = static_cast<uint32_t>(rng());
    if (((bits >> 23) & 0xffu) == 0xffu) bits &= 0xbfffffffu;  // no NaN/inf here
    float value = 0.0f;
    std::memcpy(&value, &bits, sizeof(value));
    ASSERT_EQ(float_to_bf16(value), reference(value)) << value << " bits 0x" << std::hex << bits;
  }
  // Ties: 1 + 2^-8 lies between 1 and 1 + 2^-7 (odd): to 1; the next tie goes up.
  EXPECT_EQ(float_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  EXPECT_EQ(float_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max()), 0x7f80);  // rounds past the largest
  EXPECT_EQ(float_to_bf16(static_cast<float>(largest)), 0x7f7f);
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(float_to_bf16(-std::numeric_limits<float>::infinity()), 0xff80);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  // A NaN whose payload sits in the low half alone stays NaN (it would truncate to infinity).
  uint32_t low_nan_bits = 0x7f800001u;
  float low_nan = 0.0f;
  std::memcpy(&low_nan, &low_nan_bits, sizeof(low_nan));
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(low_nan))));
  EXPECT_EQ(float_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::denorm_min()), 0x0000);  // rounds to 0
  EXPECT_EQ(float_to_bf16(std::ldexp(1.0f, -133)), 0x0001);  // the smallest bf16 denormal
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::min()), 0x0080);
}

// fp16's edges: the largest finite value, overflow, denormals, NaN and infinity.
TEST(Half, EdgesAndSpecialValues) {
  EXPECT_EQ(float_to_half(65504.0f), 0x7bff);
  EXPECT_EQ(float_to_half(65519.99f), 0x7bff);  // below half an ulp past the largest
  EXPECT_EQ(float_to_half(65520.0f), 0x7c00);   // the tie rounds to even: infinity
  EXPECT_EQ(float_to_half(-1e6f), 0xfc00);
  EXPECT_EQ(float_to_half(std::ldexp(1.0f, -24)), 0x0001);     // smallest denormal
  EXPECT_EQ(float_to_half(std::ldexp(1.0f, -25)), 0x0000);     // the tie rounds to 0 (even)
  EXPECT_EQ(float_to_half(std::ldexp(1.5f, -25)), 0x0001);     // above the tie: up
  EXPECT_EQ(float_to_half(std::ldexp(1.0f, -14)), 0x0400);     // smallest normal
  EXPECT_EQ(float_to_half(std::ldexp(1023.0f, -24)), 0x03ff);  // largest denormal
  EXPECT_EQ(float_to_half(-std::numeric_limits<float>::infinity()), 0xfc00);
  EXPECT_TRUE(std::isnan(half_to_float(float_to_half(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(half_to_float(0x8000), -0.0f);
  EXPECT_TRUE(std::signbit(half_to_float(0x8000)));
}

}  // namespace
}  // namespace gpubox
