// dcn's vector cross layers and dcn_v2's DCN-Mix layers (CrossNet kinds kVector, kMixture;
// kMatrix is layers_cross_net_test.cu's): the forward against a float64 reference written from the
// formulas (DCN: x0 * (x_l . w_l) + b_l + x_l; DCN-Mix: x0 * (sum_e softmax(x_l G + g)_e
// tanh(tanh(x_l V_e) C_e) U_e + b_l) + x_l), every parameter gradient and the pooled gradient
// against central differences, stacked and parallel; the L2 term lands on the weights alone; an
// empty batch writes zero gradients; with bf16 GEMMs (CrossSpec::bf16) DCN-Mix within bf16's
// rounding of the float64 reference and dcn's vector layers bit for bit fp32's; the bf16 copy of
// the MLP's input rounds only the written columns.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>

#include "heterps/device/card.hpp"
#include "tests/trainer/one_card.hpp"
#include "tests/trainer/test_util.hpp"
#include "trainer/nn/bf16.hpp"
#include "trainer/nn/detail/cross_functors.cuh"
#include "trainer/nn/layers.hpp"

namespace gpubox::trainer {
namespace {
using device::to_device;
using device::to_host;
using testing::bf16_tolerance;
using testing::expect_gradients_near;
using testing::random_vector;
using testing::weighted_sum;

struct CrossCase {
  CrossKind kind;
  int rank;
  int experts;
  bool parallel;
  int batch = 4;
};

std::string case_name(const CrossCase& c) {
  return std::string(c.kind == CrossKind::kVector ? "vector" : "mixture") + " rank " +
         std::to_string(c.rank) + " experts " + std::to_string(c.experts) +
         (c.parallel ? " parallel" : " stacked") + " batch " + std::to_string(c.batch);
}

class CrossNetTest : public ::testing::TestWithParam<CrossCase>, protected testing::OneCard {
 protected:
  static constexpr int kDim = 6, kPooled = 5, kLayers = 2;
  static constexpr int64_t kLd = 8;

  CrossNetTest() : blas_(card_) {}
  static int batch() { return GetParam().batch; }
  CrossSpec spec() const {
    const CrossCase c = GetParam();
    return CrossSpec{kDim, kLd, kLayers, c.kind, c.rank, c.experts, c.parallel};
  }
  const ParamBlock& block(const DenseParameters& params, const std::string& name) const {
    for (const ParamBlock& b : params.blocks()) {
      if (b.name == name) return b;
    }
    ADD_FAILURE() << "no block " << name;
    return params.blocks().front();
  }

  // x_{l+1} from x_l (rows of kLd, the first kDim used) in float64, from the parameters `w`.
  std::vector<double> reference_layer(const DenseParameters& params, const std::vector<float>& w,
                                      const std::vector<float>& x0, const std::vector<double>& x,
                                      int l) const {
    const std::string name = "cross_" + std::to_string(l);
    const std::vector<float> b(w.begin() + block(params, name + ".b").offset,
                               w.begin() + block(params, name + ".b").offset + kDim);
    std::vector<double> next = x;
    for (int i = 0; i < batch(); ++i) {
      const double* xi = x.data() + i * kLd;
      const std::vector<double> pre = GetParam().kind == CrossKind::kVector
                                          ? std::vector<double>(kDim, vector_dot(params, w, xi, l))
                                          : mixture(params, w, xi, l);
      for (int j = 0; j < kDim; ++j) {
        const double x0j = x0[i * kLd + j];
        next[i * kLd + j] = GetParam().kind == CrossKind::kVector ? x0j * pre[j] + b[j] + xi[j]
                                                                  : x0j * (pre[j] + b[j]) + xi[j];
      }
    }
    return next;
  }
  double vector_dot(const DenseParameters& params, const std::vector<float>& w, const double* x,
                    int l) const {
    const std::size_t wo = block(params, "cross_" + std::to_string(l) + ".w").offset;
    double s = 0;
    for (int k = 0; k < kDim; ++k) s += x[k] * w[wo + k];
    return s;
  }
  // sum_e p_e tanh(tanh(x V_e) C_e) U_e for one row x.
  std::vector<double> mixture(const DenseParameters& params, const std::vector<float>& w,
                              const double* x, int l) const {
    const int r = GetParam().rank, experts = GetParam().experts, er = r * experts;
    const std::string name = "cross_" + std::to_string(l);
    const std::size_t vo = block(params, name + ".v").offset;
    const std::size_t co = block(params, name + ".c").offset;
    const std::size_t uo = block(params, name + ".u").offset;
    const std::size_t go = block(params, "cross_gate.w").offset;
    const std::size_t gbo = block(params, "cross_gate.b").offset;
    std::vector<double> z(experts), out(kDim, 0.0);
    double zmax = -1e300, zsum = 0;
    for (int e = 0; e < experts; ++e) {
      z[e] = w[gbo + e];
      for (int k = 0; k < kDim; ++k) z[e] += x[k] * w[go + k * experts + e];
      zmax = std::max(zmax, z[e]);
    }
    for (int e = 0; e < experts; ++e) zsum += std::exp(z[e] - zmax);
    for (int e = 0; e < experts; ++e) {
      const double p = std::exp(z[e] - zmax) / zsum;
      std::vector<double> a(r), h(r);
      for (int q = 0; q < r; ++q) {
        double s = 0;
        for (int k = 0; k < kDim; ++k) s += x[k] * w[vo + k * er + e * r + q];
        a[q] = std::tanh(s);
      }
      for (int q = 0; q < r; ++q) {
        double s = 0;
        for (int m = 0; m < r; ++m) s += a[m] * w[co + e * r * r + m * r + q];
        h[q] = std::tanh(s);
      }
      for (int j = 0; j < kDim; ++j) {
        for (int q = 0; q < r; ++q) out[j] += p * h[q] * w[uo + (e * r + q) * kDim + j];
      }
    }
    return out;
  }

  // The float64 reference's outputs at the values `w` and x0: x_L's rows as the network writes
  // them (stride kLd, the padding 0), or parallel the logits x_L . w_out.
  std::vector<double> reference_outputs(const DenseParameters& params, const std::vector<float>& w,
                                        const std::vector<float>& x0) const {
    std::vector<double> x(x0.begin(), x0.end());
    for (int l = 0; l < kLayers; ++l) x = reference_layer(params, w, x0, x, l);
    const bool parallel = GetParam().parallel;
    std::vector<double> y(static_cast<std::size_t>(batch()) * (parallel ? 1 : kLd), 0.0);
    const std::size_t out = parallel ? block(params, "cross_out.w").offset : 0;
    for (int i = 0; i < batch(); ++i) {
      for (int j = 0; j < kDim; ++j) {
        if (parallel) y[i] += x[i * kLd + j] * w[out + j];
        if (!parallel) y[i * kLd + j] = x[i * kLd + j];
      }
    }
    return y;
  }

  // Every parameter gradient (grads / scale) and the pooled one (dp) against the central
  // differences of `loss` over w and x0, within tol absolute plus tol relative.
  Blas blas_;
};

TEST_P(CrossNetTest, MatchesFloat64AndNumericalGradients) {
  const CrossCase c = GetParam();
  SCOPED_TRACE(case_name(c));
  const float scale = 0.25f;
  std::mt19937_64 rng(200 + c.rank + 7 * c.experts + (c.parallel ? 1 : 0));
  DenseParameters params(card_);
  CrossNet net(card_, params, spec());
  params.finalize(13);
  std::vector<float> w = params.values_to_host();
  for (const ParamBlock& b : params.blocks()) {  // biases start at zero: make them matter
    if (b.name.size() > 2 && b.name.compare(b.name.size() - 2, 2, ".b") == 0) {
      const std::vector<float> bias = random_vector(b.count, rng, -0.3f, 0.3f);
      std::copy(bias.begin(), bias.end(), w.begin() + b.offset);
    }
  }
  std::vector<float> x0 = random_vector(static_cast<std::size_t>(batch()) * kLd, rng);
  for (int i = 0; i < batch(); ++i) {  // the rows' padding is never read
    for (int64_t j = kDim; j < kLd; ++j) x0[i * kLd + j] = std::numeric_limits<float>::quiet_NaN();
  }
  const std::vector<float> big_r = random_vector(static_cast<std::size_t>(batch()) * kLd, rng);
  const std::vector<float> r = random_vector(batch(), rng);
  auto logits = card_.make_buffer<float>(batch());

  std::vector<double> x(x0.begin(), x0.end());
  for (int l = 0; l < kLayers; ++l) x = reference_layer(params, w, x0, x, l);

  // The loss as a function of the parameters (w) and the input (x0).
  auto forward = [&]() -> double {
    params.set_values(w);
    auto dx0 = up(x0);
    net.forward(blas_, params, dx0.data(), batch());
    if (c.parallel) {
      device::memset_bytes_async(logits.data(), 0, logits.bytes(), card_.stream());
      net.add_logits(blas_, params, batch(), logits.data());
      return weighted_sum(to_host(logits), r);
    }
    const std::vector<float> out = to_host(net.output(), batch() * kLd, card_.stream());
    double sum = 0;
    for (int i = 0; i < batch(); ++i) {
      for (int j = 0; j < kDim; ++j) sum += double{big_r[i * kLd + j]} * out[i * kLd + j];
    }
    return sum;
  };
  forward();
  const std::vector<float> got = to_host(net.output(), batch() * kLd, card_.stream());
  for (int i = 0; i < batch(); ++i) {
    for (int j = 0; j < kDim; ++j) {
      EXPECT_NEAR(got[i * kLd + j], x[i * kLd + j], 1e-4 * (1 + std::fabs(x[i * kLd + j])))
          << "x_L " << i << "," << j;
    }
  }

  auto d_pooled = card_.make_buffer<float>(batch() * kPooled);
  {
    auto dx0 = up(x0);
    if (c.parallel) {
      auto dr = up(r);
      net.backward_from_logits(blas_, params, dr.data(), scale, batch());
    } else {
      std::vector<float> scaled(big_r);
      for (float& v : scaled) v *= scale;
      device::copy_async(net.output_grad(), scaled.data(), scaled.size(), card_.stream());
    }
    net.backward(blas_, params, dx0.data(), batch(), 1.0f / scale, d_pooled.data(), kPooled,
                 kPooled, false);
  }
  const std::vector<float> grads = params.grads_to_host();
  const std::vector<float> dp = to_host(d_pooled);
  const std::size_t checked =
      expect_gradients_near(params.blocks(), w, x0, grads, dp, scale, batch(), kPooled, kLd,
                            {5e-3f, 2e-3, 5e-3}, forward);
  EXPECT_GT(checked, static_cast<std::size_t>(kLayers * kDim));
}

TEST_P(CrossNetTest, L2TermLandsOnTheWeightsAloneAndEmptyBatchWritesZeros) {
  const CrossCase c = GetParam();
  SCOPED_TRACE(case_name(c));
  DenseParameters params(card_);
  CrossNet net(card_, params, spec());
  params.finalize(5);
  // An empty batch: every gradient zero (the gate's accumulated ones too).
  net.forward(blas_, params, nullptr, 0);
  if (c.parallel) {
    auto logits = card_.make_buffer<float>(1);
    net.backward_from_logits(blas_, params, logits.data(), 1.0f, 0);
  }
  net.backward(blas_, params, nullptr, 0, 1.0f, nullptr, kPooled, kPooled, false);
  for (float g : params.grads_to_host()) ASSERT_EQ(g, 0.0f);
  // Then the L2 term alone: alpha * value on W, V, U, C and w; nothing on biases, gate, w_out.
  const float alpha = 0.5f;
  net.add_l2_gradient(card_.stream(), params, alpha);
  const std::vector<float> values = params.values_to_host();
  const std::vector<float> grads = params.grads_to_host();
  std::size_t penalised = 0;
  for (const ParamBlock& b : params.blocks()) {
    const bool weight = b.name.rfind("cross_gate", 0) != 0 && b.name != "cross_out.w" &&
                        b.name.compare(b.name.size() - 2, 2, ".b") != 0;
    penalised += weight ? b.count : 0;
    for (std::size_t k = 0; k < b.count; ++k) {
      ASSERT_EQ(grads[b.offset + k], weight ? alpha * values[b.offset + k] : 0.0f)
          << b.name << "[" << k << "]";
    }
  }
  const std::size_t per_layer = c.kind == CrossKind::kVector ? kDim
                                                             : static_cast<std::size_t>(c.experts) *
                                                                   c.rank * (2 * kDim + c.rank);
  EXPECT_EQ(penalised, kLayers * per_layer);
}

// With CrossSpec::bf16 (GPUBOX_BF16_EMULATION where the CPU has no bf16 GEMMs), from values set
// after finalize (the GEMMs must read their refreshed bf16 copy): DCN-Mix's x_L (parallel: the
// logits) and every gradient against the float64 reference and its central differences, within
// bf16's rounding, and not fp32's bits; dcn's vector layers ignore it (their GEMV stays fp32):
// the fp32 network's bits.
TEST_P(CrossNetTest, Bf16GemmsMatchFloat64WithinBf16Rounding) {
  const CrossCase c = GetParam();
  SCOPED_TRACE(case_name(c));
  setenv("GPUBOX_BF16_EMULATION", "1", 1);
  const Blas bf16_blas(card_);
  unsetenv("GPUBOX_BF16_EMULATION");
  ASSERT_NE(bf16_blas.bf16(), Bf16Support::kNone);
  CrossSpec with_bf16 = spec();
  with_bf16.bf16 = true;
  DenseParameters params(card_), params32(card_);
  params.keep_bf16_copy();
  CrossNet net(card_, params, with_bf16), net32(card_, params32, spec());
  params.finalize(13);
  params32.finalize(13);
  EXPECT_EQ(net.gemms_bf16(), c.kind != CrossKind::kVector);
  std::mt19937_64 rng(300 + c.rank + 7 * c.experts + (c.parallel ? 1 : 0));
  std::vector<float> w = random_vector(params.values_to_host().size(), rng, -0.6f, 0.6f);
  std::vector<float> x0 = random_vector(static_cast<std::size_t>(batch()) * kLd, rng);
  const std::vector<float> big_r = random_vector(static_cast<std::size_t>(batch()) * kLd, rng);
  const std::vector<float> r = random_vector(batch(), rng);
  const float scale = 0.25f;
  auto logits = card_.make_buffer<float>(batch());
  auto d_pooled = card_.make_buffer<float>(batch() * kPooled);
  // The loss L = sum R * x_L (parallel: sum r * x_L . w_out) of `n`, then its backward.
  const auto run = [&](const Blas& blas, DenseParameters& p, CrossNet& n) {
    p.set_values(w);
    auto dx0 = up(x0);
    n.forward(blas, p, dx0.data(), batch());
    std::vector<float> scaled(big_r);
    for (float& v : scaled) v *= scale;
    auto dr = up(r);
    if (c.parallel) {
      device::memset_bytes_async(logits.data(), 0, logits.bytes(), card_.stream());
      n.add_logits(blas, p, batch(), logits.data());
      n.backward_from_logits(blas, p, dr.data(), scale, batch());
    } else {
      device::copy_async(n.output_grad(), scaled.data(), scaled.size(), card_.stream());
    }
    n.backward(blas, p, dx0.data(), batch(), 1.0f / scale, d_pooled.data(), kPooled, kPooled,
               false);
    return c.parallel ? to_host(logits) : to_host(n.output(), batch() * kLd, card_.stream());
  };
  const std::vector<float> want32 = run(blas_, params32, net32);
  const std::vector<float> grads32 = params32.grads_to_host();
  const std::vector<float> got = run(bf16_blas, params, net);
  const std::vector<float> grads = params.grads_to_host();
  const std::vector<float> dp = to_host(d_pooled);
  // The outputs written: the logits, or x_L's first kDim columns of each row.
  const auto used = [&](std::size_t k) {
    return c.parallel || static_cast<int64_t>(k) % kLd < kDim;
  };
  std::size_t differing = 0;
  for (std::size_t k = 0; k < got.size(); ++k) differing += used(k) && got[k] != want32[k];
  if (c.kind == CrossKind::kVector) {
    EXPECT_EQ(differing, 0u);
    EXPECT_EQ(grads, grads32);
    return;
  }
  EXPECT_GT(differing, 0u);
  const auto reference = [&]() -> double {
    const std::vector<double> y = reference_outputs(params, w, x0);
    double sum = 0;
    for (std::size_t k = 0; k < y.size(); ++k) sum += (c.parallel ? r[k] : big_r[k]) * y[k];
    return sum;
  };
  const double tol = bf16_tolerance(kDim, 1.0);
  const std::vector<double> want = reference_outputs(params, w, x0);
  for (std::size_t k = 0; k < want.size(); ++k) {
    if (used(k)) {
      EXPECT_NEAR(got[k], want[k], tol * (1 + std::fabs(want[k]))) << "output " << k;
    }
  }
  expect_gradients_near(params.blocks(), w, x0, grads, dp, scale, batch(), kPooled, kLd,
                        {1e-2f, tol, tol}, reference);
}

INSTANTIATE_TEST_SUITE_P(Kinds, CrossNetTest,
                         ::testing::Values(CrossCase{CrossKind::kVector, 0, 0, true},
                                           CrossCase{CrossKind::kVector, 0, 0, false},
                                           CrossCase{CrossKind::kMixture, 2, 3, false},
                                           CrossCase{CrossKind::kMixture, 3, 2, true},
                                           CrossCase{CrossKind::kMixture, 2, 1, false},
                                           CrossCase{CrossKind::kVector, 0, 0, true, 1},
                                           CrossCase{CrossKind::kVector, 0, 0, false, 401},
                                           CrossCase{CrossKind::kMixture, 2, 2, false, 1}),
                         [](const ::testing::TestParamInfo<CrossCase>& info) {
                           std::string name = case_name(info.param);
                           for (char& ch : name) ch = ch == ' ' ? '_' : ch;
                           return name;
                         });

#if !defined(GPUBOX_BACKEND_CUDA)
// The cpu's run_range forms of the entrywise functors (detail/cross_functors.cuh) against their
// per-entry calls, bit for bit, with the items cut into ranges that start and end mid-row (as
// parallel_for's threads split them) and the rows strided wider than they are used.
class CrossFunctorRangesTest : public ::testing::Test {
 protected:
  static constexpr int kRows = 37, kCols = 13;
  static constexpr int64_t kStride = 16;

  // Runs make(outputs) over [0, n) once per item and once through run_range in pieces, each from
  // `start`; the outputs must be equal bit for bit.
  template <class Make>
  static void expect_bit_equal(std::size_t n, const std::vector<std::vector<float>>& start,
                               Make make, const std::string& what) {
    std::vector<std::vector<float>> per_item = start, ranged = start;
    const auto one = make(per_item);
    for (std::size_t i = 0; i < n; ++i) one(i);
    const auto range = make(ranged);
    std::vector<std::size_t> cuts = {0, 1, 7, n / 2 + 3, n - 1, n};
    for (std::size_t& cut : cuts) cut = std::min(cut, n);
    std::sort(cuts.begin(), cuts.end());
    for (std::size_t k = 0; k + 1 < cuts.size(); ++k) range.run_range(cuts[k], cuts[k + 1]);
    for (std::size_t o = 0; o < start.size(); ++o) {
      EXPECT_EQ(std::memcmp(per_item[o].data(), ranged[o].data(), start[o].size() * sizeof(float)),
                0)
          << what << ": output " << o;
    }
  }
  std::vector<float> matrix() { return random_vector(kRows * kStride, rng_); }

  std::mt19937_64 rng_{77};
};

TEST_F(CrossFunctorRangesTest, RunRangeIsBitEqualToPerEntryCalls) {
  using namespace detail;  // NOLINT(google-build-using-namespace): the functors under test
  const std::vector<float> x0 = matrix(), in = matrix(), g = matrix(), pre = matrix();
  const std::vector<float> s = random_vector(kRows, rng_), bias = random_vector(kCols, rng_);
  const std::size_t n = entries(kRows, kCols);
  expect_bit_equal(
      n, {matrix(), pre},
      [&](std::vector<std::vector<float>>& o) {
        return CrossCombine{x0.data(),   in.data(), bias.data(), o[1].data(),
                            o[0].data(), kStride,   kCols};
      },
      "CrossCombine");
  expect_bit_equal(
      n, {matrix()},
      [&](std::vector<std::vector<float>>& o) {
        return VectorCombine{x0.data(),   in.data(), s.data(), bias.data(),
                             o[0].data(), kStride,   kCols};
      },
      "VectorCombine");
  for (const bool first : {true, false}) {
    expect_bit_equal(
        n, {matrix(), matrix()},
        [&](std::vector<std::vector<float>>& o) {
          return CrossBackwardProduct{g.data(),    x0.data(), pre.data(), o[0].data(),
                                      o[1].data(), kStride,   kCols,      first};
        },
        "CrossBackwardProduct");
    expect_bit_equal(
        n, {matrix()},
        [&](std::vector<std::vector<float>>& o) {
          return VectorX0Grad{g.data(), s.data(), o[0].data(), kStride, kCols, first};
        },
        "VectorX0Grad");
  }
  const int pooled = kCols - 2;
  const int64_t pooled_ld = pooled + 3;  // padded rows (DenseModel's d_pooled_ld_): 3 left alone
  for (const bool accumulate : {true, false}) {
    expect_bit_equal(
        entries(kRows, pooled), {random_vector(kRows * pooled_ld, rng_)},
        [&](std::vector<std::vector<float>>& o) {
          return PooledGrad{g.data(),  pre.data(), o[0].data(), kStride,
                            pooled_ld, pooled,     0.37f,       accumulate};
        },
        "PooledGrad");
  }
  // Column sums over more columns than the cpu form's block of 64, and over none of the rows.
  for (const int64_t rows : {int64_t{0}, int64_t{1}, int64_t{kRows}}) {
    const int64_t wide = 150;
    const std::vector<float> m = random_vector(kRows * wide, rng_);
    for (const bool accumulate : {true, false}) {
      expect_bit_equal(
          wide, {random_vector(wide, rng_)},
          [&](std::vector<std::vector<float>>& o) {
            return ColumnSum{m.data(), o[0].data(), rows, wide, accumulate};
          },
          "ColumnSum rows " + std::to_string(rows));
    }
  }
  // Row dot products, rows in blocks of 4 on cpu: 37 rows cut mid-block (cuts at 1, 7, 21, 36).
  expect_bit_equal(
      kRows, {random_vector(kRows, rng_)},
      [&](std::vector<std::vector<float>>& o) {
        return RowDot{g.data(), x0.data(), o[0].data(), kStride, kCols};
      },
      "RowDot");
}
#endif

// dcn/dcn_v2's bf16 copy of the MLP's input (to_bf16_rows_async): the written columns rounded as
// to_bf16 rounds them, the padding zero, and the input's padding (NaN here, as if never written)
// never read; 0, 1 and several rows, no padding and no columns, and dcn's rows at a batch of
// 513 (the card's threads split the items mid-row: the cpu form goes a row's part at a time).
TEST(ToBf16Rows, RoundsTheWrittenColumnsAndZeroesThePadding) {
  device::CardSet cards = device::CardSet::from_list("0");
  device::Card& card = cards.card(0);
  card.activate();
  std::mt19937_64 rng(5);
  struct Shape {
    int64_t rows;
    int cols;
    int64_t ld;
  };
  for (const Shape shape : {Shape{0, 3, 8}, Shape{1, 3, 8}, Shape{5, 6, 8}, Shape{4, 8, 8},
                            Shape{3, 0, 4}, Shape{7, 1, 1}, Shape{513, 247, 248}}) {
    const std::size_t size = static_cast<std::size_t>(shape.rows * shape.ld);
    std::vector<float> in = random_vector(size, rng);
    for (std::size_t i = 0; i < size; ++i) {
      if (static_cast<int64_t>(i) % shape.ld >= shape.cols) {
        in[i] = std::numeric_limits<float>::quiet_NaN();
      }
    }
    const auto in_card = to_device(in, card.memory(), card.stream());
    auto out_card = to_device(std::vector<Bf16>(size, Bf16{0x7fc1}), card.memory(), card.stream());
    to_bf16_rows_async(card.stream(), in_card.data(), shape.rows, shape.cols, shape.ld,
                       out_card.data());
    const std::vector<Bf16> out = to_host(out_card);
    for (std::size_t i = 0; i < size; ++i) {
      const bool written = static_cast<int64_t>(i) % shape.ld < shape.cols;
      EXPECT_EQ(out[i].bits, written ? to_bf16(in[i]).bits : 0)
          << "rows " << shape.rows << " cols " << shape.cols << " ld " << shape.ld << " entry "
          << i;
    }
  }
  EXPECT_THROW(to_bf16_rows_async(card.stream(), nullptr, 1, 5, 4, nullptr), Error);
}

}  // namespace
}  // namespace gpubox::trainer
