// dcn_v2's cross network (CrossNet, kMatrix: full rank and low rank, stacked and parallel)
// against a float64 reference and central differences. dcn's vector cross layers and DCN-Mix:
// cross_net_test.cu.
#include <gtest/gtest.h>

#include <cmath>
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
using testing::central_difference;
using testing::expect_gradient_near;
using testing::LayersTest;
using testing::random_vector;
using testing::weighted_sum;

// dcn_v2's cross network, full rank and low rank, stacked and parallel. The forward against a
// float64 reference computing x_{l+1} = x0 * (x_l W_l + b_l) + x_l with W_l (= V_l U_l at low
// rank, formed explicitly); every parameter gradient and the pooled gradient against central
// differences of L = sum R * x_L (stacked) or sum r * (base + x_L . w_out) (parallel). The
// gradient scale is carried by the parameter gradients and multiplied out of the pooled one,
// which is added (accumulate) or written; the rows' padding is NaN and never read; an empty
// batch writes zero parameter gradients.
TEST_F(LayersTest, CrossNetMatchesFloat64AndNumericalGradients) {
  const int batch = 4, dim = 7, pooled = 5, layers = 2;
  const int64_t ld = 9;
  const float scale = 0.25f;
  struct Case {
    int rank;
    bool parallel;
  };
  for (const Case c : {Case{0, false}, Case{0, true}, Case{3, false}, Case{3, true}}) {
    SCOPED_TRACE("rank " + std::to_string(c.rank) + (c.parallel ? " parallel" : " stacked"));
    std::mt19937_64 rng(100 + c.rank + (c.parallel ? 1 : 0));
    DenseParameters params(card_);
    CrossNet net(card_, params, dim, ld, layers, c.rank, c.parallel);
    params.finalize(11);
    std::vector<float> w = params.values_to_host();
    for (const ParamBlock& b : params.blocks()) {  // biases start at zero: make them matter
      if (b.name.size() > 2 && b.name.compare(b.name.size() - 2, 2, ".b") == 0) {
        const std::vector<float> bias = random_vector(b.count, rng, -0.3f, 0.3f);
        std::copy(bias.begin(), bias.end(), w.begin() + b.offset);
      }
    }
    auto block = [&](const std::string& name) -> const ParamBlock& {
      for (const ParamBlock& b : params.blocks()) {
        if (b.name == name) return b;
      }
      ADD_FAILURE() << "no block " << name;
      return params.blocks().front();
    };
    std::vector<float> x0 = random_vector(static_cast<std::size_t>(batch) * ld, rng);
    for (int i = 0; i < batch; ++i) {
      for (int64_t j = dim; j < ld; ++j) x0[i * ld + j] = std::numeric_limits<float>::quiet_NaN();
    }
    const std::vector<float> big_r = random_vector(static_cast<std::size_t>(batch) * ld, rng);
    const std::vector<float> r = random_vector(batch, rng);
    const std::vector<float> base = random_vector(batch, rng);
    auto logits = card_.make_buffer<float>(batch);

    // float64 reference of x_L.
    std::vector<double> x(x0.begin(), x0.end());
    for (int l = 0; l < layers; ++l) {
      const std::string name = "cross_" + std::to_string(l);
      std::vector<double> weight(static_cast<std::size_t>(dim) * dim, 0.0);
      if (c.rank == 0) {
        const ParamBlock& wb = block(name + ".w");
        for (int k = 0; k < dim * dim; ++k) weight[k] = w[wb.offset + k];
      } else {
        const ParamBlock& vb = block(name + ".v");
        const ParamBlock& ub = block(name + ".u");
        for (int a = 0; a < dim; ++a) {
          for (int b = 0; b < dim; ++b) {
            for (int k = 0; k < c.rank; ++k) {
              weight[a * dim + b] +=
                  double{w[vb.offset + a * c.rank + k]} * w[ub.offset + k * dim + b];
            }
          }
        }
      }
      const ParamBlock& bb = block(name + ".b");
      std::vector<double> next = x;
      for (int i = 0; i < batch; ++i) {
        for (int j = 0; j < dim; ++j) {
          double pre = w[bb.offset + j];
          for (int k = 0; k < dim; ++k) pre += x[i * ld + k] * weight[k * dim + j];
          next[i * ld + j] = x0[i * ld + j] * pre + x[i * ld + j];
        }
      }
      x = next;
    }

    // The loss as a function of the parameters (w) and the input (x0); leaves x_L on the card.
    auto forward = [&]() -> double {
      params.set_values(w);
      auto dx0 = up(x0);
      net.forward(blas_, params, dx0.data(), batch);
      if (c.parallel) {
        device::copy_async(logits.data(), base.data(), batch, card_.stream());
        net.add_logits(blas_, params, batch, logits.data());
        return weighted_sum(to_host(logits), r);
      }
      const std::vector<float> out = to_host(net.output(), batch * ld, card_.stream());
      double sum = 0;
      for (int i = 0; i < batch; ++i) {
        for (int j = 0; j < dim; ++j) sum += double{big_r[i * ld + j]} * out[i * ld + j];
      }
      return sum;
    };
    forward();
    if (c.parallel) {
      const ParamBlock& ob = block("cross_out.w");
      const std::vector<float> got = to_host(logits);
      for (int i = 0; i < batch; ++i) {
        double want = base[i];
        for (int j = 0; j < dim; ++j) want += x[i * ld + j] * w[ob.offset + j];
        EXPECT_NEAR(got[i], want, 1e-4 * (1 + std::fabs(want))) << "logit " << i;
      }
    } else {
      const std::vector<float> got = to_host(net.output(), batch * ld, card_.stream());
      for (int i = 0; i < batch; ++i) {
        for (int j = 0; j < dim; ++j) {
          EXPECT_NEAR(got[i * ld + j], x[i * ld + j], 1e-4 * (1 + std::fabs(x[i * ld + j])))
              << "x_L " << i << "," << j;
        }
      }
    }

    // Backward from the scaled top gradient.
    auto backward = [&](float* d_pooled, bool accumulate) {
      auto dx0 = up(x0);
      auto dr = up(r);
      if (c.parallel) {
        net.backward_from_logits(blas_, params, dr.data(), scale, batch);
      } else {
        std::vector<float> scaled(big_r);
        for (float& v : scaled) v *= scale;
        device::copy_async(net.output_grad(), scaled.data(), scaled.size(), card_.stream());
      }
      net.backward(blas_, params, dx0.data(), batch, 1.0f / scale, d_pooled, pooled, accumulate);
    };
    const std::vector<float> d_init = random_vector(static_cast<std::size_t>(batch) * pooled, rng);
    auto d_pooled = up(d_init);
    backward(d_pooled.data(), true);
    const std::vector<float> grads = params.grads_to_host();
    const std::vector<float> dp = to_host(d_pooled);
    std::size_t checked = 0;
    for (const ParamBlock& b : params.blocks()) {
      for (std::size_t k = 0; k < b.count; ++k) {
        const double numeric = central_difference(w, b.offset + k, 1e-2f, forward);
        expect_gradient_near(grads[b.offset + k] / scale, numeric, 2e-3, 2e-3,
                             b.name + "[" + std::to_string(k) + "]");
        ++checked;
      }
    }
    EXPECT_GT(checked, static_cast<std::size_t>(layers * dim));
    for (int i = 0; i < batch; ++i) {
      for (int j = 0; j < pooled; ++j) {
        const double numeric = central_difference(x0, i * ld + j, 1e-2f, forward);
        expect_gradient_near(dp[i * pooled + j] - d_init[i * pooled + j], numeric, 2e-3, 2e-3,
                             "pooled " + std::to_string(i) + "," + std::to_string(j));
      }
    }
    // Written rather than added: the same values without d_init.
    forward();
    backward(d_pooled.data(), false);
    const std::vector<float> written = to_host(d_pooled);
    for (std::size_t k = 0; k < written.size(); ++k) {
      EXPECT_NEAR(written[k], dp[k] - d_init[k], 1e-4) << k;
    }
    // An empty batch: zero parameter gradients, nothing pooled written.
    net.forward(blas_, params, nullptr, 0);
    if (c.parallel) {
      net.add_logits(blas_, params, 0, logits.data());
      net.backward_from_logits(blas_, params, logits.data(), scale, 0);
    }
    net.backward(blas_, params, nullptr, 0, 1.0f / scale, nullptr, pooled, false);
    for (float g : params.grads_to_host()) ASSERT_EQ(g, 0.0f);
  }
}

}  // namespace
}  // namespace gpubox::trainer
