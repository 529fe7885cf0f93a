// dcn_v2's cross network (CrossNet, kMatrix: full rank and low rank, stacked and parallel)
// against a float64 reference and central differences, in fp32 and with bf16 GEMMs. dcn's vector
// cross layers and DCN-Mix: cross_net_test.cu.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "heterps/device/card.hpp"
#include "tests/trainer/layers_test_fixture.hpp"
#include "tests/trainer/test_util.hpp"
#include "trainer/nn/layers.hpp"

namespace gpubox::trainer {
namespace {
using device::to_host;
using testing::bf16_tolerance;
using testing::expect_gradients_near;
using testing::GradientCheck;
using testing::LayersTest;
using testing::random_vector;
using testing::weighted_sum;

constexpr int kBatch = 4, kDim = 7, kPooled = 5, kLayers = 2;
constexpr int64_t kLd = 9;
constexpr float kScale = 0.25f;

// The block `name` of `params` (a test failure, and the first block, when there is none).
const ParamBlock& block_named(const DenseParameters& params, const std::string& name) {
  for (const ParamBlock& b : params.blocks()) {
    if (b.name == name) return b;
  }
  ADD_FAILURE() << "no block " << name;
  return params.blocks().front();
}

// Layer `name`'s W in float64 ([kDim x kDim]) from the parameter values `w`: its .w block, or at
// low rank V_l U_l formed explicitly from its .v and .u blocks.
std::vector<double> layer_weight(const DenseParameters& params, const std::vector<float>& w,
                                 const std::string& name, int rank) {
  std::vector<double> weight(static_cast<std::size_t>(kDim) * kDim, 0.0);
  if (rank == 0) {
    const ParamBlock& wb = block_named(params, name + ".w");
    for (int k = 0; k < kDim * kDim; ++k) weight[k] = w[wb.offset + k];
    return weight;
  }
  const ParamBlock& vb = block_named(params, name + ".v");
  const ParamBlock& ub = block_named(params, name + ".u");
  for (int a = 0; a < kDim; ++a) {
    for (int b = 0; b < kDim; ++b) {
      for (int k = 0; k < rank; ++k) {
        weight[a * kDim + b] += double{w[vb.offset + a * rank + k]} * w[ub.offset + k * kDim + b];
      }
    }
  }
  return weight;
}

// float64 reference of x_L from the parameter values `w` and x0 ([kBatch x kDim], row stride
// kLd): x_{l+1} = x0 * (x_l W_l + b_l) + x_l.
std::vector<double> reference_output(const DenseParameters& params, const std::vector<float>& w,
                                     const std::vector<float>& x0, int rank) {
  std::vector<double> x(x0.begin(), x0.end());
  for (int l = 0; l < kLayers; ++l) {
    const std::string name = "cross_" + std::to_string(l);
    const std::vector<double> weight = layer_weight(params, w, name, rank);
    const ParamBlock& bb = block_named(params, name + ".b");
    std::vector<double> next = x;
    for (int i = 0; i < kBatch; ++i) {
      for (int j = 0; j < kDim; ++j) {
        double pre = w[bb.offset + j];
        for (int k = 0; k < kDim; ++k) pre += x[i * kLd + k] * weight[k * kDim + j];
        next[i * kLd + j] = x0[i * kLd + j] * pre + x[i * kLd + j];
      }
    }
    x = next;
  }
  return x;
}

// One case of the network (rank 0: full rank; stacked or parallel) on `card`: its parameters,
// their biases made nonzero, and its inputs, drawn from a generator seeded by the case (x0's row
// padding NaN, never read); the loss L = sum R * x_L (stacked) or sum r * (base + x_L . w_out)
// (parallel) as a function of the parameter values `w` and of x0, and the backward from L's
// gradient scaled by kScale. `bf16`: the GEMMs read bf16 operands (CrossSpec::bf16).
struct CrossNetCase {
  CrossNetCase(device::Card& on, const Blas& with, int rank_in, bool parallel_in, bool bf16 = false)
      : card(on),
        blas(with),
        rank(rank_in),
        parallel(parallel_in),
        rng(100 + rank + (parallel ? 1 : 0)),
        params(card),
        net(card, params,
            CrossSpec{kDim, kLd, kLayers, CrossKind::kMatrix, rank, 0, parallel, bf16}) {
    if (bf16) params.keep_bf16_copy();
    params.finalize(11);
    w = params.values_to_host();
    for (const ParamBlock& b : params.blocks()) {  // biases start at zero: make them matter
      if (b.name.size() > 2 && b.name.compare(b.name.size() - 2, 2, ".b") == 0) {
        const std::vector<float> bias = random_vector(b.count, rng, -0.3f, 0.3f);
        std::copy(bias.begin(), bias.end(), w.begin() + b.offset);
      }
    }
    x0 = random_vector(static_cast<std::size_t>(kBatch) * kLd, rng);
    for (int i = 0; i < kBatch; ++i) {
      for (int64_t j = kDim; j < kLd; ++j)
        x0[i * kLd + j] = std::numeric_limits<float>::quiet_NaN();
    }
    big_r = random_vector(static_cast<std::size_t>(kBatch) * kLd, rng);
    r = random_vector(kBatch, rng);
    base = random_vector(kBatch, rng);
    logits = card.make_buffer<float>(kBatch);
  }

  // L at the values `w` and x0; leaves x_L on the card.
  double loss() {
    params.set_values(w);
    auto dx0 = device::to_device(x0, card.memory(), card.stream());
    net.forward(blas, params, dx0.data(), kBatch);
    if (parallel) {
      device::copy_async(logits.data(), base.data(), kBatch, card.stream());
      net.add_logits(blas, params, kBatch, logits.data());
      return weighted_sum(to_host(logits), r);
    }
    const std::vector<float> out = to_host(net.output(), kBatch * kLd, card.stream());
    double sum = 0;
    for (int i = 0; i < kBatch; ++i) {
      for (int j = 0; j < kDim; ++j) sum += double{big_r[i * kLd + j]} * out[i * kLd + j];
    }
    return sum;
  }

  // Parallel: the float64 logit of row i from the reference x_L `x`.
  double reference_logit(const std::vector<double>& x, int i) const {
    const ParamBlock& ob = block_named(params, "cross_out.w");
    double logit = base[i];
    for (int j = 0; j < kDim; ++j) logit += x[i * kLd + j] * w[ob.offset + j];
    return logit;
  }

  // L in float64 from the reference x_L at the values `w` and x0.
  double reference_loss() const {
    const std::vector<double> x = reference_output(params, w, x0, rank);
    double sum = 0;
    for (int i = 0; i < kBatch; ++i) {
      if (parallel) {
        sum += r[i] * reference_logit(x, i);
        continue;
      }
      for (int j = 0; j < kDim; ++j) sum += big_r[i * kLd + j] * x[i * kLd + j];
    }
    return sum;
  }

  // After loss(): its logits (parallel) or x_L (stacked) against the float64 reference x_L `x`,
  // within `rel` (1 + |want|).
  void expect_output_near(const std::vector<double>& x, double rel = 1e-4) {
    if (parallel) {
      const std::vector<float> got = to_host(logits);
      for (int i = 0; i < kBatch; ++i) {
        const double want = reference_logit(x, i);
        EXPECT_NEAR(got[i], want, rel * (1 + std::fabs(want))) << "logit " << i;
      }
      return;
    }
    const std::vector<float> got = to_host(net.output(), kBatch * kLd, card.stream());
    for (int i = 0; i < kBatch; ++i) {
      for (int j = 0; j < kDim; ++j) {
        EXPECT_NEAR(got[i * kLd + j], x[i * kLd + j], rel * (1 + std::fabs(x[i * kLd + j])))
            << "x_L " << i << "," << j;
      }
    }
  }

  // After loss(): the backward from the scaled top gradient, the pooled gradient added to
  // d_pooled (accumulate) or written.
  void backward(float* d_pooled, bool accumulate) {
    auto dx0 = device::to_device(x0, card.memory(), card.stream());
    auto dr = device::to_device(r, card.memory(), card.stream());
    if (parallel) {
      net.backward_from_logits(blas, params, dr.data(), kScale, kBatch);
    } else {
      std::vector<float> scaled(big_r);
      for (float& v : scaled) v *= kScale;
      device::copy_async(net.output_grad(), scaled.data(), scaled.size(), card.stream());
    }
    net.backward(blas, params, dx0.data(), kBatch, 1.0f / kScale, d_pooled, kPooled, kPooled,
                 accumulate);
  }

  device::Card& card;
  const Blas& blas;
  const int rank;
  const bool parallel;
  std::mt19937_64 rng;
  DenseParameters params;
  CrossNet net;
  std::vector<float> w, x0, big_r, r, base;
  device::device_buffer<float> logits;
};

// dcn_v2's cross network, full rank and low rank, stacked and parallel. The forward against a
// float64 reference computing x_{l+1} = x0 * (x_l W_l + b_l) + x_l with W_l (= V_l U_l at low
// rank, formed explicitly); every parameter gradient and the pooled gradient against central
// differences of L = sum R * x_L (stacked) or sum r * (base + x_L . w_out) (parallel). The
// gradient scale is carried by the parameter gradients and multiplied out of the pooled one,
// which is added (accumulate) or written; the rows' padding is NaN and never read; an empty
// batch writes zero parameter gradients.
TEST_F(LayersTest, CrossNetMatchesFloat64AndNumericalGradients) {
  struct Case {
    int rank;
    bool parallel;
  };
  for (const Case c : {Case{0, false}, Case{0, true}, Case{3, false}, Case{3, true}}) {
    SCOPED_TRACE("rank " + std::to_string(c.rank) + (c.parallel ? " parallel" : " stacked"));
    CrossNetCase cross(card_, blas_, c.rank, c.parallel);
    const auto loss = [&]() -> double { return cross.loss(); };
    loss();
    cross.expect_output_near(reference_output(cross.params, cross.w, cross.x0, c.rank));

    const std::vector<float> d_init =
        random_vector(static_cast<std::size_t>(kBatch) * kPooled, cross.rng);
    auto d_pooled = up(d_init);
    cross.backward(d_pooled.data(), true);
    const std::vector<float> grads = cross.params.grads_to_host();
    const std::vector<float> dp = to_host(d_pooled);
    std::vector<float> added(dp.size());  // the gradient backward added to d_init
    for (std::size_t i = 0; i < dp.size(); ++i) added[i] = dp[i] - d_init[i];
    const std::size_t checked =
        expect_gradients_near(cross.params.blocks(), cross.w, cross.x0, grads, added, kScale,
                              kBatch, kPooled, kLd, GradientCheck{}, loss);
    EXPECT_GT(checked, static_cast<std::size_t>(kLayers * kDim));
    // Written rather than added: the same values without d_init.
    loss();
    cross.backward(d_pooled.data(), false);
    const std::vector<float> written = to_host(d_pooled);
    for (std::size_t k = 0; k < written.size(); ++k) {
      EXPECT_NEAR(written[k], dp[k] - d_init[k], 1e-4) << k;
    }
    // An empty batch: zero parameter gradients, nothing pooled written.
    cross.net.forward(blas_, cross.params, nullptr, 0);
    if (c.parallel) {
      cross.net.add_logits(blas_, cross.params, 0, cross.logits.data());
      cross.net.backward_from_logits(blas_, cross.params, cross.logits.data(), kScale, 0);
    }
    cross.net.backward(blas_, cross.params, nullptr, 0, 1.0f / kScale, nullptr, kPooled, kPooled,
                       false);
    for (float g : cross.params.grads_to_host()) ASSERT_EQ(g, 0.0f);
  }
}

// The same network with bf16 GEMMs (CrossSpec::bf16; GPUBOX_BF16_EMULATION where the CPU has
// none), from weights set after finalize (the GEMMs must read their refreshed bf16 copy): x_L
// (parallel: the logits), every parameter gradient and the pooled gradient against the float64
// reference and its central differences, within bf16's rounding; and not the fp32 path's values.
TEST_F(LayersTest, CrossNetBf16GemmsMatchFloat64WithinBf16Rounding) {
  setenv("GPUBOX_BF16_EMULATION", "1", 1);
  const Blas bf16_blas(card_);
  unsetenv("GPUBOX_BF16_EMULATION");
  ASSERT_NE(bf16_blas.bf16(), Bf16Support::kNone);
  const double tol = bf16_tolerance(kDim, 1.0);
  for (const int rank : {0, 3}) {
    for (const bool parallel : {false, true}) {
      SCOPED_TRACE("rank " + std::to_string(rank) + (parallel ? " parallel" : " stacked"));
      CrossNetCase cross(card_, bf16_blas, rank, parallel, true);
      ASSERT_TRUE(cross.net.gemms_bf16());
      for (const ParamBlock& b : cross.params.blocks()) {  // weights other than finalize's
        if (b.name.compare(b.name.size() - 2, 2, ".b") == 0) continue;
        const std::vector<float> fresh = random_vector(b.count, cross.rng, -0.6f, 0.6f);
        std::copy(fresh.begin(), fresh.end(), cross.w.begin() + b.offset);
      }
      cross.loss();
      cross.expect_output_near(reference_output(cross.params, cross.w, cross.x0, rank), tol);
      auto d_pooled = card_.make_buffer<float>(static_cast<std::size_t>(kBatch) * kPooled);
      cross.backward(d_pooled.data(), false);
      const std::vector<float> grads = cross.params.grads_to_host();
      const std::vector<float> dp = to_host(d_pooled);
      const auto reference = [&]() -> double { return cross.reference_loss(); };
      expect_gradients_near(cross.params.blocks(), cross.w, cross.x0, grads, dp, kScale, kBatch,
                            kPooled, kLd, {1e-2f, tol, tol}, reference);
      // bf16 did run: the fp32 network on the same values computes other bits.
      CrossNetCase fp32(card_, blas_, rank, parallel);
      fp32.w = cross.w;
      EXPECT_NE(fp32.loss(), cross.loss());
    }
  }
}

}  // namespace
}  // namespace gpubox::trainer
