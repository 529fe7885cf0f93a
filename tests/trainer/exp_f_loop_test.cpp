// detail::exp_f_loop (trainer/nn/detail/exp_f_loop.cuh), its cpu form: within one unit in the last
// place of a float64 exp over a sample of every float (every 257th bit pattern) and the neighbours
// of its edges; and, where glibc's expf runs its FMA form (glibc 2.27 or later on an x86-64 with
// FMA and AVX2, as its ifunc picks), equal to that expf bit for bit over the same floats.
#include "trainer/nn/detail/exp_f_loop.cuh"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>

namespace gpubox::trainer {
namespace {

float float_of(std::uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

std::uint32_t bits_of(float f) {
  std::uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return bits;
}

// check(x) for every 257th float bit pattern and the 4 floats each side of the edges.
template <class Check>
void for_sample(Check check) {
  for (std::uint64_t b = 0; b < (std::uint64_t{1} << 32); b += 257) {
    check(float_of(static_cast<std::uint32_t>(b)));
  }
  for (float edge : {0.0f, -0.0f, 88.0f, -88.0f, 0x1.62e42ep6f, -0x1.9fe368p6f, -0x1.9d1d9ep6f,
                     -87.33654f, 1e-10f, -1e-10f, INFINITY, -INFINITY}) {
    float below = edge, above = edge;
    for (int i = 0; i < 5; ++i) {
      check(below);
      check(above);
      below = std::nextafter(below, -INFINITY);
      above = std::nextafter(above, INFINITY);
    }
  }
  check(NAN);
  check(-NAN);
}

// glibc's expf is its FMA form here (its x86-64 ifunc: FMA and AVX2 usable).
bool glibc_runs_fma_expf() {
#if defined(__GLIBC__) && defined(__x86_64__) && \
    (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 27))
  __builtin_cpu_init();
  return __builtin_cpu_supports("fma") && __builtin_cpu_supports("avx2");
#else
  return false;
#endif
}

TEST(ExpFLoop, WithinOneUlpOfFloat64) {
  int64_t bad = 0;
  float first_bad = 0.0f;
  for_sample([&](float x) {
    const float e = detail::exp_f_loop(x);
    const double want = std::exp(static_cast<double>(x));
    bool ok;
    if (std::isnan(x)) {
      ok = std::isnan(e);
    } else if (want > 0x1.fffffep127) {
      ok = e == INFINITY;
    } else {
      // One float step at e, at least the smallest subnormal's (below 2^-126 the steps are that).
      const float up = std::nextafter(e, INFINITY);
      const double ulp = e == INFINITY ? 0.0 : static_cast<double>(up) - e;
      ok = e >= 0.0f && std::fabs(static_cast<double>(e) - want) <= ulp;
    }
    if (!ok && bad++ == 0) first_bad = x;
  });
  EXPECT_EQ(bad, 0) << "first at x = " << first_bad << " (" << detail::exp_f_loop(first_bad)
                    << " against " << std::exp(static_cast<double>(first_bad)) << ")";
}

TEST(ExpFLoop, SameBitsAsGlibcExpfFmaForm) {
  if (!glibc_runs_fma_expf()) GTEST_SKIP() << "glibc's expf is not its x86-64 FMA form here";
  int64_t differ = 0;
  float first = 0.0f;
  for_sample([&](float x) {
    const float mine = detail::exp_f_loop(x), glibc = expf(x);
    const bool same = std::isnan(glibc) ? std::isnan(mine) : bits_of(mine) == bits_of(glibc);
    if (!same && differ++ == 0) first = x;
  });
  EXPECT_EQ(differ, 0) << "first at x = " << first << " (bits "
                       << bits_of(detail::exp_f_loop(first)) << " against glibc's "
                       << bits_of(expf(first)) << ")";
}

}  // namespace
}  // namespace gpubox::trainer
