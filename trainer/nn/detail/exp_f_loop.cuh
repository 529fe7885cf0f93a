// exp_f_loop(x): e^x for loops over many values, the same bits as a call to expf where that call
// runs glibc's x86-64 FMA form. Device: expf. cpu: glibc's expf (2.27 and later,
// sysdeps/ieee754/flt-32/e_expf.c) written out as the form its x86-64 ifunc picks where FMA and
// AVX2 run computes it: fused where that form fuses, by std::fma, so every instruction set the
// cpu backend clones for (heterps/device/isa_clones.cuh) gives the same bits; with its results
// below -103.28, above 88.72 and at NaN. A loop of it vectorizes, where a call to expf takes one
// value at a time. tests/trainer/exp_f_loop_test.cu compares it with glibc's expf where that
// is the FMA form (every float: its DISABLED_EveryFloat, run once: docs/bench/h157.md).
// Cost on a cpu without FMA (before Haswell / Piledriver): every clone there is the baseline,
// whose std::fma calls libm's fma, a software emulation on such a cpu, five a value: slower than
// the old call to expf (glibc's non-FMA form) on those machines, with the same bits as here.
// Bits only: no errno, not glibc's FE flags; round to nearest, no FTZ/DAZ assumed; past the edges
// the float cast of an out-of-range double is UB by [conv.double] (g++: inf), then masked off.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "common/macros.hpp"

namespace gpubox::trainer::detail {

// e^x = 2^(k/32) 2^(r/32), k = round(x 32 / ln 2): 2^(k/32) from the table (entry i: the bits of
// 2^(i/32) less i << 47, so that adding k << 47 scales it by 2^(k div 32)), 2^(r/32) a cubic in
// r, all in double; glibc's constants. Host data: only exp_f_loop's cpu form reads them.
inline constexpr std::uint64_t kExp2fTable[32] = {
    0x3ff0000000000000ull, 0x3fefd9b0d3158574ull, 0x3fefb5586cf9890full, 0x3fef9301d0125b51ull,
    0x3fef72b83c7d517bull, 0x3fef54873168b9aaull, 0x3fef387a6e756238ull, 0x3fef1e9df51fdee1ull,
    0x3fef06fe0a31b715ull, 0x3feef1a7373aa9cbull, 0x3feedea64c123422ull, 0x3feece086061892dull,
    0x3feebfdad5362a27ull, 0x3feeb42b569d4f82ull, 0x3feeab07dd485429ull, 0x3feea47eb03a5585ull,
    0x3feea09e667f3bcdull, 0x3fee9f75e8ec5f74ull, 0x3feea11473eb0187ull, 0x3feea589994cce13ull,
    0x3feeace5422aa0dbull, 0x3feeb737b0cdc5e5ull, 0x3feec49182a3f090ull, 0x3feed503b23e255dull,
    0x3feee89f995ad3adull, 0x3feeff76f2fb5e47ull, 0x3fef199bdd85529cull, 0x3fef3720dcef9069ull,
    0x3fef5818dcfba487ull, 0x3fef7c97337b9b5full, 0x3fefa4afa2a490daull, 0x3fefd0765b6e4540ull,
};
inline constexpr double kExpfInvLn2N = 0x1.71547652b82fep+5;  // 32 / ln 2
inline constexpr double kExpfShift = 0x1.8p+52;               // rounds to an integer when added
inline constexpr double kExpfPoly[3] = {0x1.c6af84b912394p-20, 0x1.ebfce50fac4f3p-13,
                                        0x1.62e42ff0c52d6p-6};

GPUBOX_HD GPUBOX_FORCEINLINE float exp_f_loop(float x) {
#if GPUBOX_ON_DEVICE
  return expf(x);
#else
  const double xd = x;
  double kd = std::fma(kExpfInvLn2N, xd, kExpfShift);
  std::uint64_t ki;
  std::memcpy(&ki, &kd, sizeof ki);
  kd -= kExpfShift;
  const double r = std::fma(kExpfInvLn2N, xd, -kd);
  const std::uint64_t t = kExp2fTable[ki % 32] + (ki << 47);
  double s;
  std::memcpy(&s, &t, sizeof s);
  const double z = std::fma(kExpfPoly[0], r, kExpfPoly[1]);
  const double r2 = r * r;
  double y = std::fma(kExpfPoly[2], r, 1.0);
  y = std::fma(z, r2, y);
  const auto e = static_cast<float>(y * s);
  // glibc's edges: 0 below log(2^-150), its smallest subnormal below log(2^-149), inf above
  // log(2^128), x + x at NaN (a quiet NaN; -inf takes the first edge). Tested on x's bits (floats
  // of one sign order as their bits) and blended by masks: the loop then vectorizes, where float
  // comparisons (which may raise an exception at NaN) or chained selects stay branches in g++.
  std::uint32_t x_bits, e_bits, quiet_bits;
  std::memcpy(&x_bits, &x, sizeof x_bits);
  std::memcpy(&e_bits, &e, sizeof e_bits);
  const float quiet = x + x;
  std::memcpy(&quiet_bits, &quiet, sizeof quiet_bits);
  const auto mask = [](bool b) { return 0u - static_cast<std::uint32_t>(b); };
  const std::uint32_t no_value = mask(x_bits > 0xc2cff1b4u);     // x < -0x1.9fe368p6f, -inf
  const std::uint32_t least_value = mask(x_bits > 0xc2ce8ecfu);  // x < -0x1.9d1d9ep6f
  const std::uint32_t overflow =
      mask(static_cast<std::int32_t>(x_bits) > 0x42b17217);  // x > 0x1.62e42ep6f, +inf
  const std::uint32_t nan = mask((x_bits & 0x7fffffffu) > 0x7f800000u);
  const std::uint32_t edge_bits = 0x00000001u & ~no_value;  // 2^-149, or 0
  std::uint32_t out = (e_bits & ~least_value) | (edge_bits & least_value);
  out = (out & ~overflow) | (0x7f800000u & overflow);
  out = (out & ~nan) | (quiet_bits & nan);
  float result;
  std::memcpy(&result, &out, sizeof result);
  return result;
#endif
}

}  // namespace gpubox::trainer::detail
