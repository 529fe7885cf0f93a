// Every layer's forward against a naive reference and its backward against float64 central
// differences of a weighted sum of its outputs: the fused linear layers (fp32 and bf16), the
// wide part, the sigmoid log loss, bf16 rounding, the non-finite search. The folded ReLU mask:
// layers_relu_mask_test.cu (what it refuses: layers_relu_mask_contract_test.cu); the slot pool:
// layers_slot_pool_test.cu; the matrix cross network: layers_cross_net_test.cu (the same binary
// and fixture, layers_test_fixture.hpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "heterps/device/card.hpp"
#include "heterps/heter_comm/heter_comm_types.hpp"
#include "tests/trainer/layers_test_fixture.hpp"
#include "tests/trainer/test_util.hpp"
#include "trainer/nn/layers.hpp"

namespace gpubox::trainer {
namespace {
using device::to_host;
using testing::central_difference;
using testing::expect_gradient_near;
using testing::LayersTest;
using testing::random_vector;
using testing::weighted_sum;

// Two fused layers, A (hidden: bias + ReLU in its forward) feeding B (input_is_relu: the ReLU
// backward folded into its input-gradient GEMM), with padded row strides and A's input gradient
// for its first dx_cols columns only, scaled by alpha, as DenseModel uses them. Loss = sum of
// r * Y_B. Every output and gradient against float64 (forward reference, central differences).
struct ChainShape {
  int batch, in, hidden, out, dx_cols;
  int64_t pad;  // extra elements at the end of every row
};

class LinearChainTest : public LayersTest, public ::testing::WithParamInterface<ChainShape> {
 protected:
  struct Chain {
    Chain(device::Card& card, Blas& blas, const ChainShape& c, ElementType type) : params(card) {
      LinearGemmSpec a;
      a.name = "a";
      a.in = c.in;
      a.out = c.hidden;
      a.input = a.output = type;
      a.dx = ElementType::kF32;
      a.relu = true;
      a.dx_cols = c.dx_cols;
      a.x_ld = c.in + c.pad;
      a.y_ld = a.dz_ld = c.hidden + c.pad;
      a.dx_ld = c.dx_cols + c.pad;
      LinearGemmSpec b;
      b.name = "b";
      b.in = c.hidden;
      b.out = c.out;
      b.input = b.dx = type;
      b.output = ElementType::kF32;
      b.input_is_relu = true;
      b.dx_cols = c.hidden;
      b.x_ld = b.dx_ld = a.y_ld;
      b.y_ld = b.dz_ld = c.out + c.pad;
      layer_a = std::make_unique<Linear>(params, blas, a);
      layer_b = std::make_unique<Linear>(params, blas, b);
      if (type == ElementType::kBf16) params.keep_bf16_copy();
      params.finalize(5);
      layer_a->prepare(c.batch);
      layer_b->prepare(c.batch);
    }
    DenseParameters params;
    std::unique_ptr<Linear> layer_a, layer_b;
  };

  // Row-major [rows x cols] host floats into a strided card buffer of `type` (bf16: rounded).
  device::device_buffer<char> upload(const std::vector<float>& v, int rows, int cols, int64_t ld,
                                     ElementType type) {
    std::vector<char> bytes(static_cast<std::size_t>(std::max(rows, 1)) * ld * element_bytes(type),
                            0);
    for (int i = 0; i < rows; ++i) {
      for (int j = 0; j < cols; ++j) {
        const float x = v[static_cast<std::size_t>(i) * cols + j];
        const std::size_t at = static_cast<std::size_t>(i) * ld + j;
        if (type == ElementType::kBf16) {
          reinterpret_cast<Bf16*>(bytes.data())[at] = to_bf16(x);
        } else {
          reinterpret_cast<float*>(bytes.data())[at] = x;
        }
      }
    }
    return up(bytes);
  }
  std::vector<float> download(const device::device_buffer<char>& buf, int rows, int cols,
                              int64_t ld, ElementType type) {
    const std::vector<char> bytes = to_host(buf);
    std::vector<float> v(static_cast<std::size_t>(rows) * cols);
    for (int i = 0; i < rows; ++i) {
      for (int j = 0; j < cols; ++j) {
        const std::size_t at = static_cast<std::size_t>(i) * ld + j;
        v[static_cast<std::size_t>(i) * cols + j] =
            type == ElementType::kBf16 ? to_float(reinterpret_cast<const Bf16*>(bytes.data())[at])
                                       : reinterpret_cast<const float*>(bytes.data())[at];
      }
    }
    return v;
  }

  struct Result {
    std::vector<float> y_a, y_b, grads, dx;
  };
  // Forward (and backward) of the chain with parameter values `w` and input `x`. Outputs start
  // as 7s, so a value the GEMMs fail to write shows.
  Result run_chain(Chain& chain, const ChainShape& c, const std::vector<float>& w,
                   const std::vector<float>& x, const std::vector<float>& r, float alpha,
                   ElementType type, bool backward, float alpha_b = 1.0f) {
    Linear& a = *chain.layer_a;
    Linear& b = *chain.layer_b;
    chain.params.set_values(w);
    auto sevens = [](int n) { return std::vector<float>(static_cast<std::size_t>(n), 7.0f); };
    auto xa = upload(x, c.batch, c.in, a.spec().x_ld, type);
    auto ya = upload(sevens(c.batch * c.hidden), c.batch, c.hidden, a.spec().y_ld, type);
    auto yb = upload(sevens(c.batch * c.out), c.batch, c.out, b.spec().y_ld, ElementType::kF32);
    a.forward(chain.params, xa.data(), ya.data(), c.batch);
    b.forward(chain.params, ya.data(), yb.data(), c.batch);
    Result res;
    res.y_a = download(ya, c.batch, c.hidden, a.spec().y_ld, type);
    res.y_b = download(yb, c.batch, c.out, b.spec().y_ld, ElementType::kF32);
    if (!backward) return res;
    auto dzb = upload(r, c.batch, c.out, b.spec().dz_ld, type);
    auto dza = upload(sevens(c.batch * c.hidden), c.batch, c.hidden, a.spec().dz_ld, type);
    auto dx =
        upload(sevens(c.batch * c.dx_cols), c.batch, c.dx_cols, a.spec().dx_ld, ElementType::kF32);
    b.backward_weights(chain.params, ya.data(), dzb.data(), c.batch);
    b.backward_data(chain.params, dzb.data(), ya.data(), &a, alpha_b, dza.data(), c.batch);
    a.backward_weights(chain.params, xa.data(), dza.data(), c.batch);
    a.backward_data(chain.params, dza.data(), xa.data(), nullptr, alpha, dx.data(), c.batch);
    res.grads = chain.params.grads_to_host();
    res.dx = download(dx, c.batch, c.dx_cols, a.spec().dx_ld, ElementType::kF32);
    return res;
  }

  // Seeded parameters, inputs and output weights r in [-1, 1], with A's pre-activations at
  // least 0.05 from ReLU's kink, so central differences never cross it.
  static void make_inputs(const Chain& chain, const ChainShape& c, std::vector<float>& w,
                          std::vector<float>& x, std::vector<float>& r) {
    const DenseParameters& p = chain.params;
    const std::size_t wa = p.blocks()[chain.layer_a->weight_block()].offset;
    const std::size_t ba = p.blocks()[chain.layer_a->bias_block()].offset;
    for (uint64_t seed = 1;; ++seed) {
      std::mt19937_64 rng(seed * 977 + c.batch);
      w = random_vector(p.size(), rng);
      x = random_vector(static_cast<std::size_t>(c.batch) * c.in, rng);
      r = random_vector(static_cast<std::size_t>(c.batch) * c.out, rng);
      bool clear = true;
      for (int i = 0; i < c.batch && clear; ++i) {
        for (int o = 0; o < c.hidden && clear; ++o) {
          double pre = w[ba + o];
          for (int k = 0; k < c.in; ++k) {
            pre += double{x[i * c.in + k]} * w[wa + k * c.hidden + o];
          }
          clear = std::fabs(pre) > 0.05;
        }
      }
      if (clear) return;
    }
  }
};

TEST_P(LinearChainTest, FusedLayersMatchFloat64ReferenceAndNumericalGradients) {
  const ChainShape c = GetParam();
  Chain chain(card_, blas_, c, ElementType::kF32);
  const float alpha = 4.0f;  // DenseModel's 1 / dense scale on the first layer's input gradient
  std::vector<float> w, x, r;
  make_inputs(chain, c, w, x, r);
  const Result res = run_chain(chain, c, w, x, r, alpha, ElementType::kF32, true);
  const DenseParameters& p = chain.params;
  const std::size_t wa = p.blocks()[chain.layer_a->weight_block()].offset;
  const std::size_t ba = p.blocks()[chain.layer_a->bias_block()].offset;
  const std::size_t wb = p.blocks()[chain.layer_b->weight_block()].offset;
  const std::size_t bb = p.blocks()[chain.layer_b->bias_block()].offset;
  // Forward against float64.
  std::vector<double> ya(static_cast<std::size_t>(c.batch) * c.hidden);
  for (int i = 0; i < c.batch; ++i) {
    for (int o = 0; o < c.hidden; ++o) {
      double pre = w[ba + o];
      for (int k = 0; k < c.in; ++k) pre += double{x[i * c.in + k]} * w[wa + k * c.hidden + o];
      ya[i * c.hidden + o] = std::max(pre, 0.0);
      EXPECT_NEAR(res.y_a[i * c.hidden + o], ya[i * c.hidden + o], 1e-5) << i << " " << o;
    }
    for (int o = 0; o < c.out; ++o) {
      double y = w[bb + o];
      for (int k = 0; k < c.hidden; ++k) y += ya[i * c.hidden + k] * w[wb + k * c.out + o];
      EXPECT_NEAR(res.y_b[i * c.out + o], y, 1e-5) << i << " " << o;
    }
  }
  // Backward against central differences of the loss.
  auto loss = [&] {
    return weighted_sum(run_chain(chain, c, w, x, r, alpha, ElementType::kF32, false).y_b, r);
  };
  ASSERT_GE(res.grads.size(), w.size());
  for (std::size_t k = 0; k < w.size(); ++k) {
    const double numeric = central_difference(w, k, 1e-2f, loss);
    expect_gradient_near(res.grads[k], numeric, 1e-4, 1e-3, "param " + p.describe(k));
  }
  for (int i = 0; i < c.batch; ++i) {
    for (int k = 0; k < c.dx_cols; ++k) {
      const double numeric = central_difference(x, i * c.in + k, 1e-2f, loss);
      expect_gradient_near(res.dx[i * c.dx_cols + k], alpha * numeric, 1e-4, 1e-3,
                           "dX " + std::to_string(i) + "," + std::to_string(k));
    }
  }
}

// bf16 operands (GPUBOX_BF16_EMULATION where the CPU has no bf16 GEMMs) against the fp32 path on
// the same values: every output within the bf16 rounding bound of its dot products.
TEST_P(LinearChainTest, Bf16PathStaysWithinRoundingBoundOfFp32) {
  const ChainShape c = GetParam();
  setenv("GPUBOX_BF16_EMULATION", "1", 1);
  Blas bf16_blas(card_);
  unsetenv("GPUBOX_BF16_EMULATION");
  ASSERT_NE(bf16_blas.bf16(), Bf16Support::kNone);
  Chain fp32(card_, blas_, c, ElementType::kF32);
  Chain bf16(card_, bf16_blas, c, ElementType::kBf16);
  const float alpha = 4.0f;
  std::vector<float> w, x, r;
  make_inputs(fp32, c, w, x, r);
  const Result want = run_chain(fp32, c, w, x, r, alpha, ElementType::kF32, true);
  const Result got = run_chain(bf16, c, w, x, r, alpha, ElementType::kBf16, true);
  // Every operand is rounded once to bf16 (relative error <= 2^-8 each, so <= 2^-7 per product)
  // and a bf16 result once more; with |x|, |w|, |r| <= 1 a sum of n products moves by at most
  // about n 2^-7 plus the error carried in from the layer before. The bounds below are those,
  // with a factor 2 of margin; a wrong operand, stride or mask misses them by far.
  const double u = std::ldexp(1.0, -7);
  const double bound_a = 2 * u * (c.in + 1);
  const double bound_b = 2 * u * (c.hidden * (c.in + 1) + c.hidden + 1);
  for (std::size_t k = 0; k < want.y_a.size(); ++k) {
    EXPECT_NEAR(got.y_a[k], want.y_a[k], bound_a) << "y_a " << k;
  }
  for (std::size_t k = 0; k < want.y_b.size(); ++k) {
    EXPECT_NEAR(got.y_b[k], want.y_b[k], bound_b) << "y_b " << k;
  }
  const double bound_grad = bound_b * std::max(1, c.batch) * c.out * (c.in + c.hidden);
  ASSERT_EQ(got.grads.size(), want.grads.size());
  for (std::size_t k = 0; k < want.grads.size(); ++k) {
    EXPECT_NEAR(got.grads[k], want.grads[k], bound_grad) << fp32.params.describe(k);
  }
  for (std::size_t k = 0; k < want.dx.size(); ++k) {
    EXPECT_NEAR(got.dx[k], want.dx[k], alpha * bound_grad) << "dX " << k;
  }
  // And the bf16 path is not the fp32 one: a weight that bf16 cannot hold reads rounded.
  if (c.batch > 0) {
    double largest = 0;
    for (std::size_t k = 0; k < want.y_b.size(); ++k) {
      largest = std::max(largest, std::fabs(double{got.y_b[k]} - want.y_b[k]));
    }
    EXPECT_GT(largest, 0.0);
  }
}

// The input gradient's GEMM without a runtime output scale (the path of bf16 GEMMs on AMX,
// linear_gemms_onednn.cpp make_data; GPUBOX_UNSCALED_INPUT_GRADIENT=1 takes it on any CPU, =0
// takes the runtime-scaled one on AMX too) against the runtime-scaled one, fp32 and bf16
// (emulated where the CPU has none): alpha 4 into A's fp32 dX (the pass after the GEMM scales),
// and 1 or 1.25 into B's masked dX (bf16 rows with 1.25: the GEMM into fp32 rows, which the pass
// scales, masks and rounds). Kernels differ, so within the sums'
// rounding: fp32 1e-5 relative, bf16 a bf16 rounding (2^-7) of the value and its neighbours.
TEST_P(LinearChainTest, UnscaledInputGradientMatchesTheRuntimeScaledOne) {
  const ChainShape c = GetParam();
  setenv("GPUBOX_BF16_EMULATION", "1", 1);
  Blas bf16_blas(card_);
  unsetenv("GPUBOX_BF16_EMULATION");
  for (const ElementType type : {ElementType::kF32, ElementType::kBf16}) {
    Blas& blas = type == ElementType::kBf16 ? bf16_blas : blas_;
    for (const float alpha_b : {1.0f, 1.25f}) {
      SCOPED_TRACE(std::string(element_type_name(type)) + ", alpha_b " + std::to_string(alpha_b));
      setenv("GPUBOX_UNSCALED_INPUT_GRADIENT", "0", 1);
      Chain scaled(card_, blas, c, type);
      setenv("GPUBOX_UNSCALED_INPUT_GRADIENT", "1", 1);
      Chain unscaled(card_, blas, c, type);
      unsetenv("GPUBOX_UNSCALED_INPUT_GRADIENT");
      std::vector<float> w, x, r;
      make_inputs(scaled, c, w, x, r);
      const Result want = run_chain(scaled, c, w, x, r, 4.0f, type, true, alpha_b);
      const Result got = run_chain(unscaled, c, w, x, r, 4.0f, type, true, alpha_b);
      const double rel = type == ElementType::kBf16 ? std::ldexp(1.0, -6) : 1e-5;
      ASSERT_EQ(got.grads.size(), want.grads.size());
      for (std::size_t k = 0; k < want.grads.size(); ++k) {
        EXPECT_NEAR(got.grads[k], want.grads[k], rel * (1 + std::fabs(want.grads[k])))
            << scaled.params.describe(k);
      }
      ASSERT_EQ(got.dx.size(), want.dx.size());
      for (std::size_t k = 0; k < want.dx.size(); ++k) {
        EXPECT_NEAR(got.dx[k], want.dx[k], rel * (1 + std::fabs(want.dx[k]))) << "dX " << k;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, LinearChainTest,
                         ::testing::Values(ChainShape{0, 5, 4, 3, 5, 0},
                                           ChainShape{1, 5, 4, 3, 5, 0},
                                           ChainShape{4, 6, 5, 1, 4, 3},
                                           ChainShape{9, 7, 8, 2, 3, 5}));

TEST_F(LayersTest, WidePartMatchesReferenceAndNumericalGradients) {
  const int batch = 4, slots = 3, mf_dim = 2, dense_dim = 3;
  const float scale = 0.25f;
  for (bool use_cvm : {false, true}) {
    std::mt19937_64 rng(use_cvm ? 31 : 32);
    SlotSumPool pool(slots, mf_dim, use_cvm);
    DenseParameters params(card_);
    WidePart wide(params, pool, dense_dim);
    params.finalize(1);
    std::vector<float> w = random_vector(params.size(), rng);
    std::vector<float> pooled =
        random_vector(static_cast<std::size_t>(batch) * pool.out_dim(), rng);
    std::vector<float> dense = random_vector(static_cast<std::size_t>(batch) * dense_dim, rng);
    std::vector<float> base = random_vector(batch, rng);  // the deep logit it is added to
    const std::vector<float> r = random_vector(batch, rng);
    auto logits = card_.make_buffer<float>(batch);
    auto run = [&] {
      params.set_values(w);
      auto dp = up(pooled);
      auto dd = up(dense);
      device::copy_async(logits.data(), base.data(), batch, card_.stream());
      wide.forward(card_.stream(), params, InputRows{dp.data(), pool.out_dim(), ElementType::kF32},
                   dd.data(), batch, logits.data());
      return weighted_sum(to_host(logits), r);
    };
    run();
    const std::size_t w_off = params.blocks()[wide.weight_block()].offset;
    std::vector<float> got = to_host(logits);
    for (int i = 0; i < batch; ++i) {
      double want = base[i];
      for (int s = 0; s < slots; ++s) {
        want += pooled[i * pool.out_dim() + s * pool.width() + pool.embed_w_column()];
      }
      for (int d = 0; d < dense_dim; ++d) want += dense[i * dense_dim + d] * w[w_off + d];
      EXPECT_NEAR(got[i], want, 1e-5);
    }
    std::vector<float> d_pooled_init = random_vector(pooled.size(), rng);  // deep part's gradient
    auto d_pooled = up(d_pooled_init);
    auto dd = up(dense);
    auto dz = up(r);
    wide.backward(blas_, params, dd.data(), dz.data(), batch, scale, d_pooled.data(),
                  pool.out_dim());
    std::vector<float> grads = params.grads_to_host();
    for (int d = 0; d < dense_dim; ++d) {
      expect_gradient_near(grads[w_off + d], scale * central_difference(w, w_off + d, 1e-2f, run),
                           1e-4, 1e-3, "w_dense");
    }
    std::vector<float> dp = to_host(d_pooled);
    for (std::size_t k = 0; k < pooled.size(); ++k) {
      const double numeric = central_difference(pooled, k, 1e-2f, run);
      expect_gradient_near(dp[k] - d_pooled_init[k], numeric, 1e-4, 1e-3,
                           "pooled " + std::to_string(k));
    }
  }
}

TEST_F(LayersTest, SigmoidLogLossIsStableAndItsGradientIsPredMinusLabel) {
  std::vector<float> logits{-100.0f, -20.0f, -1.5f, 0.0f, 0.3f, 2.0f, 20.0f, 100.0f};
  std::vector<float> labels{0, 1, 1, 0, 1, 0, 1, 0};
  const std::size_t n = logits.size();
  auto dl = up(logits);
  auto dy = up(labels);
  auto preds = card_.make_buffer<float>(n);
  auto dz = card_.make_buffer<float>(n);
  const double loss = SigmoidLogLoss::forward_backward(card_.stream(), dl.data(), dy.data(), n,
                                                       preds.data(), dz.data());
  double want = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double z = logits[i];
    // log(1 + e^z) - y z, written without overflow for the reference too.
    want += (z > 0 ? z + std::log1p(std::exp(-z)) : std::log1p(std::exp(z))) - labels[i] * z;
  }
  EXPECT_TRUE(std::isfinite(loss));
  EXPECT_NEAR(loss, want, 1e-9 * want);
  std::vector<float> p = to_host(preds), g = to_host(dz);
  for (std::size_t i = 0; i < n; ++i) {
    EXPECT_NEAR(p[i], 1.0 / (1.0 + std::exp(-static_cast<double>(logits[i]))), 1e-7);
    EXPECT_NEAR(g[i], p[i] - labels[i], 1e-7);
    if (std::fabs(logits[i]) < 5) {
      auto one = [&] {
        auto d = up(logits);
        return SigmoidLogLoss::forward_backward(card_.stream(), d.data(), dy.data(), n, nullptr,
                                                nullptr);
      };
      expect_gradient_near(g[i], central_difference(logits, i, 1e-3f, one), 1e-5, 1e-3, "dz");
    }
  }
  EXPECT_EQ(
      SigmoidLogLoss::forward_backward(card_.stream(), dl.data(), dy.data(), 0, nullptr, nullptr),
      0.0);
}

// bf16 rounding: nearest even on the 16 dropped bits, exact back to float, NaN kept, overflow to
// infinity; the card-side conversion gives the same bits as the host one.
TEST_F(LayersTest, Bf16RoundsToNearestEvenOnHostAndCard) {
  auto from_bits = [](uint32_t u) {
    float x = 0;
    std::memcpy(&x, &u, sizeof(x));
    return x;
  };
  EXPECT_EQ(to_float(to_bf16(1.0f)), 1.0f);
  EXPECT_EQ(to_bf16(from_bits(0x3f808000u)).bits, 0x3f80u);  // tie, even below
  EXPECT_EQ(to_bf16(from_bits(0x3f818000u)).bits, 0x3f82u);  // tie, even above
  EXPECT_EQ(to_bf16(from_bits(0x3f808001u)).bits, 0x3f81u);  // above the tie
  EXPECT_EQ(to_bf16(from_bits(0x3f807fffu)).bits, 0x3f80u);  // below the tie
  EXPECT_EQ(to_bf16(-0.0f).bits, 0x8000u);
  EXPECT_TRUE(std::isnan(to_float(to_bf16(std::nanf("")))));
  EXPECT_TRUE(std::isinf(to_float(to_bf16(std::numeric_limits<float>::max()))));
  EXPECT_EQ(to_float(to_bf16(std::numeric_limits<float>::infinity())),
            std::numeric_limits<float>::infinity());
  std::mt19937_64 rng(8);
  std::vector<float> v = random_vector(1000, rng, -1e3f, 1e3f);
  v.push_back(1e-40f);  // denormal
  auto in = up(v);
  auto out = card_.make_buffer<Bf16>(v.size());
  to_bf16_async(card_.stream(), in.data(), v.size(), out.data());
  const std::vector<Bf16> got = to_host(out);
  for (std::size_t i = 0; i < v.size(); ++i) {
    EXPECT_EQ(got[i].bits, to_bf16(v[i]).bits) << i;
    // Within half a unit of bf16's 8-bit significand (of its smallest denormal, 2^-133, below).
    EXPECT_LE(std::fabs(to_float(got[i]) - v[i]),
              std::max(std::ldexp(std::fabs(v[i]), -8), std::ldexp(1.0f, -134)))
        << i;
  }
}

TEST_F(LayersTest, FindNonFiniteReturnsFirstBadIndex) {
  std::vector<float> v(5000, 1.0f);
  auto clean = up(v);
  EXPECT_EQ(find_non_finite(card_.stream(), clean.data(), v.size()), v.size());
  EXPECT_EQ(find_non_finite(card_.stream(), clean.data(), 0), 0u);
  v[4097] = std::numeric_limits<float>::infinity();
  v[4999] = std::nanf("");
  auto bad = up(v);
  EXPECT_EQ(find_non_finite(card_.stream(), bad.data(), v.size()), 4097u);
}

// The enqueued form (the step's check of the dense gradients; its cpu pass tests the bits,
// compiled per instruction set): the first non-finite index, or kNoVeto, whatever the ranges the
// pass is cut into: a value alone, the last of 17, and the first of several in 4099 (a vector
// width's tail and a lone inf, -inf or NaN, finite extremes and denormals around them).
TEST_F(LayersTest, FindNonFiniteAsyncMarksTheFirstBadIndex) {
  auto first_bad = card_.make_buffer<uint32_t>(1);
  const auto run = [&](const std::vector<float>& v) {
    auto values = up(v);
    find_non_finite_async(card_.stream(), values.data(), v.size(), first_bad.data());
    return to_host(first_bad).at(0);
  };
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::nanf("");
  for (const std::size_t n : {std::size_t{1}, std::size_t{17}, std::size_t{4099}}) {
    SCOPED_TRACE("n = " + std::to_string(n));
    std::vector<float> v(n, std::numeric_limits<float>::max());
    for (std::size_t i = 0; i < n; i += 3) v[i] = std::numeric_limits<float>::denorm_min();
    if (n > 1) v[1] = -std::numeric_limits<float>::max();
    EXPECT_EQ(run(v), heter_comm::kNoVeto);
    for (const float bad : {inf, -inf, nan}) {
      std::vector<float> w = v;
      w[n - 1] = bad;
      EXPECT_EQ(run(w), n - 1);
      if (n < 4099) continue;
      w[2050] = bad;
      w[4000] = nan;
      EXPECT_EQ(run(w), 2050u);
    }
  }
}

}  // namespace
}  // namespace gpubox::trainer
