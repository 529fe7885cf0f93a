// detail::exp_f_loop (trainer/nn/detail/exp_f_loop.cuh), its cpu form: within one unit in the last
// place of a float64 exp over a sample of every float (every 257th bit pattern) and the neighbours
// of its edges; its known bits at the floats where computing r unfused would change them; the
// same bits through device::isa_clones (a vectorized loop in the machine's clone) as in the scalar
// form; and, where glibc's expf runs its FMA form (glibc 2.27 or later on an x86-64 with FMA and
// AVX2, as its ifunc picks), equal to that expf bit for bit over the same floats. Every float, the
// same checks: DISABLED_EveryFloat (--gtest_also_run_disabled_tests, about 4 minutes of CPU).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "heterps/device/card.hpp"
#include "heterps/device/isa_clones.cuh"
#include "heterps/device/memory.hpp"
#include "heterps/device/parallel_for.cuh"
#include "trainer/nn/detail/exp_f_loop.cuh"

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

// What a difference from glibc's expf means: exp_f_loop was written after glibc 2.27's form and
// checked against every float of 2.36's; a later glibc may change its expf.
constexpr const char* kGlibcNote =
    ": exp_f_loop is no longer equal to this libc's expf (written after glibc 2.27's FMA form, "
    "every float checked against 2.36's); that alone does not make it wrong (WithinOneUlpOfFloat64 "
    "says whether it is), but its callers' bits then differ from a loop of expf's";

// exp_f_loop(x) within one float step of e^x (float64), inf above the float range, NaN at NaN.
bool within_one_ulp(float x, float e) {
  const double want = std::exp(static_cast<double>(x));
  if (std::isnan(x)) return std::isnan(e);
  if (want > 0x1.fffffep127) return e == INFINITY;
  // One float step at e, at least the smallest subnormal's (below 2^-126 the steps are that).
  const float up = std::nextafter(e, INFINITY);
  const double ulp = e == INFINITY ? 0.0 : static_cast<double>(up) - e;
  return e >= 0.0f && std::fabs(static_cast<double>(e) - want) <= ulp;
}

bool same_as_glibc(float x, float e) {
  const float glibc = expf(x);
  return std::isnan(glibc) ? std::isnan(e) : bits_of(e) == bits_of(glibc);
}

TEST(ExpFLoop, WithinOneUlpOfFloat64) {
  std::int64_t bad = 0;
  float first_bad = 0.0f;
  for_sample([&](float x) {
    if (!within_one_ulp(x, detail::exp_f_loop(x)) && bad++ == 0) first_bad = x;
  });
  EXPECT_EQ(bad, 0) << "first at x = " << first_bad << " (" << detail::exp_f_loop(first_bad)
                    << " against " << std::exp(static_cast<double>(first_bad)) << ")";
}

TEST(ExpFLoop, SameBitsAsGlibcExpfFmaForm) {
  if (!glibc_runs_fma_expf()) GTEST_SKIP() << "glibc's expf is not its x86-64 FMA form here";
  std::int64_t differ = 0;
  float first = 0.0f;
  for_sample([&](float x) {
    if (!same_as_glibc(x, detail::exp_f_loop(x)) && differ++ == 0) first = x;
  });
  EXPECT_EQ(differ, 0) << "first at x = " << first << " (bits "
                       << bits_of(detail::exp_f_loop(first)) << " against glibc's "
                       << bits_of(expf(first)) << ")" << kGlibcNote;
}

// The only two floats without an edge result (every float was searched once, in 13 s) whose bits
// change where r = x 32 / ln 2 - k is computed as a product and a subtraction instead of one fused
// multiply-add, as glibc's FMA form computes it: one unit lower each. Their bits are glibc 2.36's
// expf's, kept here so that this runs on any libc and cpu.
TEST(ExpFLoop, KnownBitsWhereAnUnfusedRWouldDiffer) {
  const struct {
    float x;
    std::uint32_t bits;
  } known[] = {{0x1.04845ep+5f, 0x56fc9f1cu}, {-0x1.f8cbb2p+5f, 0x11fa2993u}};
  for (const auto& k : known) {
    EXPECT_EQ(bits_of(detail::exp_f_loop(k.x)), k.bits) << "x = " << k.x;
    if (glibc_runs_fma_expf()) {
      EXPECT_EQ(bits_of(expf(k.x)), k.bits) << "x = " << k.x << kGlibcNote;
    }
  }
}

#if !defined(GPUBOX_BACKEND_CUDA)
// e[i] = exp_f_loop(x[i]); run_range: one loop over the items, which g++ vectorizes in each clone.
struct ExpOver {
  const float* x;
  float* e;
  void operator()(std::size_t i) const { e[i] = detail::exp_f_loop(x[i]); }
  void run_range(std::size_t begin, std::size_t end) const {
    const float* __restrict__ in = x;
    float* __restrict__ out = e;
    for (std::size_t i = begin; i < end; ++i) out[i] = detail::exp_f_loop(in[i]);
  }
};

// exp_f_loop over `xs` through device::isa_clones (the machine's best clone: AVX2 and FMA, or
// AVX-512, or the baseline), as autoint's SoftmaxRows runs it.
std::vector<float> exp_through_clones(device::Card& card, const std::vector<float>& xs) {
  auto x = device::to_device(xs, card.memory(), card.stream());
  auto e = card.make_buffer<float>(xs.size());
  device::parallel_for(card.stream(), xs.size(), device::isa_clones(ExpOver{x.data(), e.data()}));
  return device::to_host(e);
}

// Which x of `xs` differ bit for bit between the cloned loop and the scalar form (NaNs included:
// both form x + x).
std::int64_t clones_differ(device::Card& card, const std::vector<float>& xs, float* first) {
  const std::vector<float> cloned = exp_through_clones(card, xs);
  std::int64_t differ = 0;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    if (bits_of(cloned[i]) != bits_of(detail::exp_f_loop(xs[i])) && differ++ == 0) *first = xs[i];
  }
  return differ;
}

TEST(ExpFLoop, ThroughIsaClonesSameBitsAsTheScalarForm) {
  device::CardSet cards = device::CardSet::from_list("0");
  device::Card& card = cards.card(0);
  card.activate();
  std::vector<float> xs;
  for_sample([&](float x) { xs.push_back(x); });
  xs.push_back(0x1.04845ep+5f);
  xs.push_back(-0x1.f8cbb2p+5f);
  float first = 0.0f;
  EXPECT_EQ(clones_differ(card, xs, &first), 0) << "first at x = " << first;
}

// Every float: the cloned loop against the scalar form, within one ulp of float64, and against
// glibc's expf where that is its FMA form. Not run by default (about 4 minutes of CPU).
TEST(ExpFLoop, DISABLED_EveryFloat) {
  device::CardSet cards = device::CardSet::from_list("0");
  device::Card& card = cards.card(0);
  card.activate();
  const bool glibc = glibc_runs_fma_expf();
  constexpr std::uint64_t kChunk = std::uint64_t{1} << 24;
  std::int64_t clone_differ = 0, not_within = 0, glibc_differ = 0;
  float first_clone = 0.0f, first_not_within = 0.0f, first_glibc = 0.0f;
  std::vector<float> xs(kChunk);
  for (std::uint64_t base = 0; base < (std::uint64_t{1} << 32); base += kChunk) {
    for (std::uint64_t i = 0; i < kChunk; ++i)
      xs[i] = float_of(static_cast<std::uint32_t>(base + i));
    float first = 0.0f;
    const std::int64_t d = clones_differ(card, xs, &first);
    if (d > 0 && clone_differ == 0) first_clone = first;
    clone_differ += d;
    for (const float x : xs) {
      const float e = detail::exp_f_loop(x);
      if (!within_one_ulp(x, e) && not_within++ == 0) first_not_within = x;
      if (glibc && !same_as_glibc(x, e) && glibc_differ++ == 0) first_glibc = x;
    }
  }
  EXPECT_EQ(clone_differ, 0) << "cloned loop against the scalar form, first at x = " << first_clone;
  EXPECT_EQ(not_within, 0) << "first at x = " << first_not_within;
  EXPECT_EQ(glibc_differ, 0) << "first at x = " << first_glibc << kGlibcNote;
}
#endif

}  // namespace
}  // namespace gpubox::trainer
