// BatchNorm (batch_norm.hpp) alone, against a float64 reference written from Paddle's
// BatchNorm1D: the training forward (the batch's biased statistics), the inference forward (the
// running ones), every gradient against central differences of the reference through the ReLU
// before it, the running statistics' change, and the edge sizes (0, 1 and 2 rows; 31, 32 and 33
// columns around the cpu form's chunk of 32; 63, 64, 65, 130 and 451 rows around the staged
// sums' 64 row chunks), each with the column sums in one pass and staged (nvcc's default).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "heterps/device/card.hpp"
#include "tests/heterps/device/test_cards.hpp"
#include "tests/trainer/test_util.hpp"
#include "trainer/nn/batch_norm.hpp"
#include "trainer/nn/dense_parameters.hpp"

namespace gpubox::trainer {
namespace {

struct Shape {
  int64_t rows;
  int cols;
};

uint32_t bits_of(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  return bits;
}

// y = gamma (x - mu) / sqrt(var + eps) + beta per column, x = relu(z), in float64; `mean`/`var`:
// the statistics to use, or empty for the batch's own (returned through them).
std::vector<double> reference(const std::vector<double>& z, Shape s, const std::vector<double>& g,
                              const std::vector<double>& b, std::vector<double>& mean,
                              std::vector<double>& var, double eps = 1e-5) {
  const bool batch_stats = mean.empty();
  if (batch_stats) {
    mean.assign(s.cols, 0.0);
    var.assign(s.cols, 0.0);
    for (int j = 0; j < s.cols; ++j) {
      for (int64_t i = 0; i < s.rows; ++i) mean[j] += std::max(z[i * s.cols + j], 0.0) / s.rows;
      for (int64_t i = 0; i < s.rows; ++i) {
        const double d = std::max(z[i * s.cols + j], 0.0) - mean[j];
        var[j] += d * d / s.rows;
      }
    }
  }
  std::vector<double> y(z.size());
  for (int64_t i = 0; i < s.rows; ++i) {
    for (int j = 0; j < s.cols; ++j) {
      const double x = std::max(z[i * s.cols + j], 0.0);
      y[i * s.cols + j] = g[j] * (x - mean[j]) / std::sqrt(var[j] + eps) + b[j];
    }
  }
  return y;
}

class BatchNormTest : public ::testing::Test {
 protected:
  BatchNormTest() : cards_(device::CardSet::from_list("0")), card_(cards_.card(0)) {
    card_.activate();
  }
  // A norm over `cols` columns, padded row strides (cols + 3) as the MLP's are.
  struct Layer {
    DenseParameters params;
    BatchNorm norm;
  };
  static BatchNormSpec spec(int cols) {
    BatchNormSpec s;
    s.name = "fc_0.bn";
    s.cols = cols;
    s.x_ld = s.y_ld = s.grad_ld = cols + 3;
    return s;
  }
  // Rows of `ld` from a dense [rows x cols] host matrix, and back.
  static std::vector<float> pad(const std::vector<float>& m, Shape s, int64_t ld) {
    std::vector<float> out(s.rows * ld, 0.0f);
    for (int64_t i = 0; i < s.rows; ++i) {
      std::copy_n(m.begin() + i * s.cols, s.cols, out.begin() + i * ld);
    }
    return out;
  }
  static std::vector<float> unpad(const std::vector<float>& m, Shape s, int64_t ld) {
    std::vector<float> out(s.rows * s.cols);
    for (int64_t i = 0; i < s.rows; ++i) {
      std::copy_n(m.begin() + i * ld, s.cols, out.begin() + i * s.cols);
    }
    return out;
  }
  // The batch's mean and variance of `x_host` ([rows x cols]) as the layer computes them, read
  // from the running statistics' changes (momentum 0, running statistics 0, share 1: the change
  // is the batch statistic).
  struct BatchStatistics {
    std::vector<float> mean, var;
  };
  BatchStatistics layer_statistics(const std::vector<float>& x_host, Shape s, bool staged) {
    DenseParameters params(card_);
    BatchNormSpec sp = spec(s.cols);
    sp.staged_column_sums = staged;
    sp.momentum = 0.0f;
    sp.input_is_relu = false;
    BatchNorm norm(card_, params, sp);
    params.finalize(1);
    std::vector<float> w = params.values_to_host();
    const ParamBlock& rmean = params.blocks()[norm.running_mean_block()];
    const ParamBlock& rvar = params.blocks()[norm.running_var_block()];
    for (int j = 0; j < s.cols; ++j) w[rvar.offset + j] = 0.0f;
    params.set_values(w);
    const int64_t ld = sp.x_ld;
    auto x = device::to_device(pad(x_host, s, ld), card_.memory(), card_.stream());
    auto dy =
        device::to_device(std::vector<float>(s.rows * ld, 0.0f), card_.memory(), card_.stream());
    auto y = card_.make_buffer<float>(s.rows * ld);
    auto dx = card_.make_buffer<float>(s.rows * ld);
    norm.forward_train(card_.stream(), params, x.data(), y.data(), s.rows);
    norm.backward(card_.stream(), params, x.data(), dy.data(), dx.data(), s.rows, 1.0f);
    const std::vector<float> grads = params.grads_to_host();
    BatchStatistics out;
    out.mean.assign(grads.begin() + rmean.offset, grads.begin() + rmean.offset + s.cols);
    out.var.assign(grads.begin() + rvar.offset, grads.begin() + rvar.offset + s.cols);
    return out;
  }
  device::CardSet cards_;
  device::Card& card_;
};

// Training forward, every gradient (through the ReLU: z away from its kink) and the running
// statistics' change, for row counts 1, 2, 5, 33 and column counts around the cpu chunk, and
// around the staged sums' 64 row chunks (63, 64, 65, 130 rows: empty, one-row and partial
// chunks; 451 = 56 chunks of 8 rows, one of 3 and 7 empty); each with the column sums in one
// pass per column and staged (nvcc's default).
TEST_F(BatchNormTest, TrainingMatchesAFloat64Reference) {
  std::mt19937_64 rng(11);
  for (const bool staged : {false, true})
    for (const Shape s : {Shape{5, 3}, Shape{2, 31}, Shape{1, 4}, Shape{33, 32}, Shape{7, 33},
                          Shape{63, 2}, Shape{64, 3}, Shape{65, 2}, Shape{130, 5}, Shape{451, 2}}) {
      SCOPED_TRACE(std::to_string(s.rows) + " x " + std::to_string(s.cols) +
                   (staged ? ", staged sums" : ""));
      DenseParameters params(card_);
      BatchNormSpec sp = spec(s.cols);
      sp.staged_column_sums = staged;
      BatchNorm norm(card_, params, sp);
      params.finalize(1);
      const std::size_t n = s.rows * s.cols;
      std::vector<float> w = params.values_to_host();
      const ParamBlock& gamma = params.blocks()[norm.gamma_block()];
      const ParamBlock& beta = params.blocks()[norm.beta_block()];
      const ParamBlock& rmean = params.blocks()[norm.running_mean_block()];
      const ParamBlock& rvar = params.blocks()[norm.running_var_block()];
      EXPECT_GE(rmean.offset, beta.offset + beta.count) << "statistics follow the trained blocks";
      EXPECT_EQ(params.trained_size(), beta.offset + beta.count);
      for (int j = 0; j < s.cols; ++j) {
        EXPECT_EQ(w[gamma.offset + j], 1.0f);  // Paddle's initial values
        EXPECT_EQ(w[beta.offset + j], 0.0f);
        EXPECT_EQ(w[rmean.offset + j], 0.0f);
        EXPECT_EQ(w[rvar.offset + j], 1.0f);
        w[gamma.offset + j] = 0.5f + static_cast<float>(rng() % 100) / 100.0f;
        w[beta.offset + j] = static_cast<float>(rng() % 100) / 100.0f - 0.5f;
        w[rmean.offset + j] = 0.3f;
        w[rvar.offset + j] = 0.8f;
      }
      params.set_values(w);
      std::vector<float> z = testing::random_away_from_zero(n, rng, 0.05f);
      const std::vector<float> c = testing::random_vector(n, rng);  // dL/dy
      const int64_t ld = s.cols + 3;
      std::vector<float> x_host(n);
      for (std::size_t k = 0; k < n; ++k) x_host[k] = std::max(z[k], 0.0f);
      auto x = device::to_device(pad(x_host, s, ld), card_.memory(), card_.stream());
      auto dy = device::to_device(pad(c, s, ld), card_.memory(), card_.stream());
      auto y = card_.make_buffer<float>(s.rows * ld);
      auto dx = card_.make_buffer<float>(s.rows * ld);
      const float share = 0.25f;
      norm.forward_train(card_.stream(), params, x.data(), y.data(), s.rows);
      norm.backward(card_.stream(), params, x.data(), dy.data(), dx.data(), s.rows, share);
      const std::vector<float> got_y = unpad(device::to_host(y), s, ld);
      const std::vector<float> got_dx = unpad(device::to_host(dx), s, ld);
      const std::vector<float> grads = params.grads_to_host();

      std::vector<double> zd(z.begin(), z.end()), g(s.cols), b(s.cols);
      for (int j = 0; j < s.cols; ++j) {
        g[j] = w[gamma.offset + j];
        b[j] = w[beta.offset + j];
      }
      std::vector<double> mean, var;
      const std::vector<double> want = reference(zd, s, g, b, mean, var);
      for (std::size_t k = 0; k < n; ++k) EXPECT_NEAR(got_y[k], want[k], 2e-5) << k;
      const auto loss = [&] {
        std::vector<double> m, v;
        const std::vector<double> out = reference(zd, s, g, b, m, v);
        double sum = 0;
        for (std::size_t k = 0; k < n; ++k) sum += out[k] * c[k];
        return sum;
      };
      const auto numeric = [&](std::vector<double>& v, std::size_t k) {
        const double saved = v[k], h = 1e-6;
        v[k] = saved + h;
        const double plus = loss();
        v[k] = saved - h;
        const double minus = loss();
        v[k] = saved;
        return (plus - minus) / (2 * h);
      };
      for (std::size_t k = 0; k < n; ++k) {
        testing::expect_gradient_near(got_dx[k], numeric(zd, k), 1e-4, 1e-3,
                                      "dz " + std::to_string(k));
      }
      for (int j = 0; j < s.cols; ++j) {
        testing::expect_gradient_near(grads[gamma.offset + j], numeric(g, j), 1e-4, 1e-4, "gamma");
        testing::expect_gradient_near(grads[beta.offset + j], numeric(b, j), 1e-4, 1e-4, "beta");
        // The running statistics' change: share * (1 - 0.9) * (batch - running).
        EXPECT_NEAR(grads[rmean.offset + j], share * 0.1 * (mean[j] - 0.3), 1e-6);
        EXPECT_NEAR(grads[rvar.offset + j], share * 0.1 * (var[j] - 0.8), 1e-6);
      }
      if (s.rows == 1) {  // var = 0: y = beta, and no gradient reaches the input
        for (int j = 0; j < s.cols; ++j) {
          EXPECT_EQ(got_y[j], w[beta.offset + j]);
          EXPECT_EQ(got_dx[j], 0.0f);
        }
      }
    }
}

// Inference: the running statistics, not the batch's; the trained blocks' gradients untouched.
TEST_F(BatchNormTest, InferenceUsesTheRunningStatistics) {
  const Shape s{6, 5};
  DenseParameters params(card_);
  BatchNorm norm(card_, params, spec(s.cols));
  params.finalize(1);
  std::vector<float> w = params.values_to_host();
  std::vector<double> g(s.cols), b(s.cols), mean(s.cols), var(s.cols);
  for (int j = 0; j < s.cols; ++j) {
    g[j] = w[params.blocks()[norm.gamma_block()].offset + j] = 1.5f - 0.25f * j;
    b[j] = w[params.blocks()[norm.beta_block()].offset + j] = 0.1f * j;
    mean[j] = w[params.blocks()[norm.running_mean_block()].offset + j] = 0.2f * j - 0.3f;
    var[j] = w[params.blocks()[norm.running_var_block()].offset + j] = 0.5f + j;
  }
  params.set_values(w);
  std::mt19937_64 rng(5);
  const std::vector<float> x_host = testing::random_vector(s.rows * s.cols, rng, 0.0f, 2.0f);
  const int64_t ld = s.cols + 3;
  auto x = device::to_device(pad(x_host, s, ld), card_.memory(), card_.stream());
  auto y = card_.make_buffer<float>(s.rows * ld);
  for (const int64_t rows : {s.rows, int64_t{1}}) {  // one row normalises as any other
    norm.forward_infer(card_.stream(), params, x.data(), y.data(), rows);
    const std::vector<float> got = unpad(device::to_host(y), Shape{rows, s.cols}, ld);
    const std::vector<double> xd(x_host.begin(), x_host.begin() + rows * s.cols);
    const std::vector<double> want = reference(xd, Shape{rows, s.cols}, g, b, mean, var);
    for (std::size_t k = 0; k < got.size(); ++k) EXPECT_NEAR(got[k], want[k], 1e-5) << k;
  }
}

// A running variance below 0 (the PS modes' merged moves could overshoot one) counts as 0: the
// output is finite, (x - mean) / sqrt(eps) scaled, never a NaN.
TEST_F(BatchNormTest, ANegativeRunningVarianceCountsAsZero) {
  DenseParameters params(card_);
  BatchNorm norm(card_, params, spec(1));
  params.finalize(1);
  std::vector<float> w = params.values_to_host();
  w[params.blocks()[norm.running_var_block()].offset] = -0.5f;
  w[params.blocks()[norm.running_mean_block()].offset] = 0.25f;
  params.set_values(w);
  auto x = device::to_device(std::vector<float>{0.5f, 0, 0, 0}, card_.memory(), card_.stream());
  auto y = card_.make_buffer<float>(4);
  norm.forward_infer(card_.stream(), params, x.data(), y.data(), 1);
  EXPECT_NEAR(device::to_host(y)[0], 0.25 / std::sqrt(1e-5), 1e-2);
}

// An empty batch: zero gradients in every block (the step's all-reduce sums them), with the
// column sums in one pass and staged (every chunk empty).
TEST_F(BatchNormTest, EmptyBatchWritesZeroGradients) {
  for (const bool staged : {false, true}) {
    SCOPED_TRACE(staged ? "staged sums" : "one pass");
    DenseParameters params(card_);
    BatchNormSpec sp = spec(4);
    sp.staged_column_sums = staged;
    BatchNorm norm(card_, params, sp);
    params.finalize(1);
    // Every gradient float 0x40404040 (about 3) first.
    device::memset_bytes_async(params.grads().data(), 0x40, params.grads().bytes(), card_.stream());
    norm.forward_train(card_.stream(), params, nullptr, nullptr, 0);
    norm.backward(card_.stream(), params, nullptr, nullptr, nullptr, 0, 0.0f);
    const std::vector<float> grads = params.grads_to_host();
    for (const ParamBlock& b : params.blocks()) {
      for (std::size_t k = 0; k < b.count; ++k) EXPECT_EQ(grads[b.offset + k], 0.0f) << b.name;
    }
  }
}

// Columns far from zero (3e5, 6e5 and 9e5 + N(0, 1): float's spacing there is 1/32 to 1/16):
// the batch's mean and variance within float's rounding of a float64 reference. The staged
// chunks' M2 (shifted sums) and Chan's combination must not cancel: sum x^2 - (sum x)^2 / n per
// chunk of 65 rows misses the third column's variance by about 6e-4 (the first's by 4e-7).
TEST_F(BatchNormTest, StatisticsOfColumnsFarFromZeroStayExact) {
  const Shape s{4097, 3};
  std::mt19937_64 rng(17);
  std::normal_distribution<double> noise(0.0, 1.0);
  std::vector<float> x_host(s.rows * s.cols);
  for (int j = 0; j < s.cols; ++j) {
    for (int64_t i = 0; i < s.rows; ++i) {
      x_host[i * s.cols + j] = static_cast<float>(3e5 * (j + 1) + noise(rng));
    }
  }
  std::vector<double> mean(s.cols, 0.0), var(s.cols, 0.0);  // float64, two passes
  for (int j = 0; j < s.cols; ++j) {
    for (int64_t i = 0; i < s.rows; ++i) mean[j] += x_host[i * s.cols + j];
    mean[j] /= static_cast<double>(s.rows);
    for (int64_t i = 0; i < s.rows; ++i) {
      const double d = x_host[i * s.cols + j] - mean[j];
      var[j] += d * d / static_cast<double>(s.rows);
    }
  }
  for (const bool staged : {false, true}) {
    SCOPED_TRACE(staged ? "staged sums" : "one pass");
    const BatchStatistics got = layer_statistics(x_host, s, staged);
    for (int j = 0; j < s.cols; ++j) {
      EXPECT_NEAR(got.mean[j], mean[j], std::ldexp(std::fabs(mean[j]), -23)) << j;
      EXPECT_NEAR(got.var[j], var[j], 1e-6 * var[j]) << j;
    }
  }
}

// A NaN in a column makes its mean and variance NaN (the step's check then sees it), for one row
// (the staged chunk's M2 of a lone NaN row is NaN, not a variance of 0) and for a NaN among 70
// rows (35 staged chunks of 2: the NaN, row 35, second in chunk 17), in one pass and staged;
// the other column keeps its finite statistics.
TEST_F(BatchNormTest, ANanRowKeepsTheStatisticsNan) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const int64_t rows : {int64_t{1}, int64_t{70}}) {
    const Shape s{rows, 2};
    std::vector<float> x_host(s.rows * s.cols);
    for (int64_t i = 0; i < s.rows; ++i) {
      x_host[i * s.cols] = 0.5f * static_cast<float>(i);
      x_host[i * s.cols + 1] = 2.0f;
    }
    x_host[(rows / 2) * s.cols] = nan;
    for (const bool staged : {false, true}) {
      SCOPED_TRACE(::testing::Message() << rows << " rows, " << (staged ? "staged" : "one pass"));
      const BatchStatistics got = layer_statistics(x_host, s, staged);
      EXPECT_TRUE(std::isnan(got.mean[0])) << got.mean[0];
      EXPECT_TRUE(std::isnan(got.var[0])) << got.var[0];
      EXPECT_FLOAT_EQ(got.mean[1], 2.0f);
      EXPECT_FLOAT_EQ(got.var[1], 0.0f);
    }
  }
}

// bf16 rows (the MLP's activations in bf16): within bf16's rounding of the fp32 layer, with the
// column sums in one pass and staged (130 rows: 43 chunks of 3, one of 1, 20 empty).
TEST_F(BatchNormTest, Bf16RowsStayNearFp32) {
  const Shape s{130, 9};
  std::mt19937_64 rng(3);
  const std::vector<float> x_host = testing::random_vector(s.rows * s.cols, rng, 0.0f, 2.0f);
  const std::vector<float> c = testing::random_vector(s.rows * s.cols, rng);
  struct Out {
    std::vector<float> y, dx, grads;
  };
  const auto run = [&](ElementType type, bool staged) {
    DenseParameters params(card_);
    BatchNormSpec sp = spec(s.cols);
    sp.type = type;
    sp.staged_column_sums = staged;
    BatchNorm norm(card_, params, sp);
    params.finalize(1);
    const std::size_t bytes = element_bytes(type);
    const auto to_rows = [&](const std::vector<float>& m) {
      const std::vector<float> padded = pad(m, s, sp.x_ld);
      auto buffer = card_.make_buffer<char>(padded.size() * bytes);
      if (type == ElementType::kF32) {
        device::copy_async(reinterpret_cast<float*>(buffer.data()), padded.data(), padded.size(),
                           card_.stream());
      } else {
        std::vector<Bf16> rounded(padded.size());
        for (std::size_t k = 0; k < padded.size(); ++k) rounded[k] = to_bf16(padded[k]);
        device::copy_async(reinterpret_cast<Bf16*>(buffer.data()), rounded.data(), rounded.size(),
                           card_.stream());
      }
      card_.stream().synchronize();
      return buffer;
    };
    const auto to_floats = [&](const device::device_buffer<char>& buffer) {
      std::vector<float> out(s.rows * sp.x_ld);
      if (type == ElementType::kF32) {
        out = device::to_host(reinterpret_cast<const float*>(buffer.data()), out.size(),
                              card_.stream());
      } else {
        const std::vector<Bf16> b = device::to_host(reinterpret_cast<const Bf16*>(buffer.data()),
                                                    out.size(), card_.stream());
        for (std::size_t k = 0; k < out.size(); ++k) out[k] = to_float(b[k]);
      }
      return unpad(out, s, sp.x_ld);
    };
    auto x = to_rows(x_host), dy = to_rows(c);
    auto y = card_.make_buffer<char>(s.rows * sp.x_ld * bytes);
    auto dx = card_.make_buffer<char>(s.rows * sp.x_ld * bytes);
    norm.forward_train(card_.stream(), params, x.data(), y.data(), s.rows);
    norm.backward(card_.stream(), params, x.data(), dy.data(), dx.data(), s.rows, 1.0f);
    return Out{to_floats(y), to_floats(dx), params.grads_to_host()};
  };
  const Out want = run(ElementType::kF32, false);
  for (const bool staged : {false, true}) {
    SCOPED_TRACE(staged ? "staged sums" : "one pass");
    const Out got = run(ElementType::kBf16, staged);
    for (std::size_t k = 0; k < want.y.size(); ++k) {
      EXPECT_NEAR(got.y[k], want.y[k], 0.03 + 0.01 * std::fabs(want.y[k])) << k;
      EXPECT_NEAR(got.dx[k], want.dx[k], 0.05 + 0.02 * std::fabs(want.dx[k])) << k;
    }
    for (std::size_t k = 0; k < want.grads.size(); ++k) {
      EXPECT_NEAR(got.grads[k], want.grads[k], 0.05 + 0.02 * std::fabs(want.grads[k])) << k;
    }
  }
}

// The cpu's one-pass column sums (run_range, compiled per instruction set: isa_clones.cuh) against
// the staged ones (one scalar item per row chunk), bit for bit: up to 64 rows a chunk holds one
// row, so both add the same values in the same order. Rows 1, 2, 64; columns around the chunk
// of 32 and the AVX-512 clone's 8 doubles; a ReLU input and not.
TEST_F(BatchNormTest, OnePassSumsEqualTheStagedBitForBit) {
  std::mt19937_64 rng(5);
  for (const bool relu : {false, true})
    for (const Shape s :
         {Shape{1, 1}, Shape{2, 9}, Shape{64, 31}, Shape{64, 32}, Shape{33, 33}, Shape{17, 70}}) {
      SCOPED_TRACE(std::to_string(s.rows) + " x " + std::to_string(s.cols));
      const int64_t ld = s.cols + 3;
      const std::vector<float> x_host = testing::random_vector(s.rows * s.cols, rng, -1.0f, 2.0f);
      const std::vector<float> c = testing::random_vector(s.rows * s.cols, rng);
      auto x = device::to_device(pad(x_host, s, ld), card_.memory(), card_.stream());
      auto dy = device::to_device(pad(c, s, ld), card_.memory(), card_.stream());
      const auto run = [&](bool staged) {
        DenseParameters params(card_);
        BatchNormSpec sp = spec(s.cols);
        sp.staged_column_sums = staged;
        sp.input_is_relu = relu;
        BatchNorm norm(card_, params, sp);
        params.finalize(1);
        auto y = card_.make_buffer<float>(s.rows * ld);
        auto dx = card_.make_buffer<float>(s.rows * ld);
        norm.forward_train(card_.stream(), params, x.data(), y.data(), s.rows);
        norm.backward(card_.stream(), params, x.data(), dy.data(), dx.data(), s.rows, 0.5f);
        std::vector<float> out = unpad(device::to_host(y), s, ld);
        for (const float v : unpad(device::to_host(dx), s, ld)) out.push_back(v);
        for (const float v : params.grads_to_host()) out.push_back(v);
        return out;
      };
      const std::vector<float> want = run(true), got = run(false);
      ASSERT_EQ(got.size(), want.size());
      for (std::size_t k = 0; k < want.size(); ++k) {
        EXPECT_EQ(bits_of(got[k]), bits_of(want[k])) << k;
      }
    }
}

TEST_F(BatchNormTest, RefusesBadShapes) {
  DenseParameters params(card_);
  BatchNormSpec bad = spec(4);
  bad.x_ld = 3;
  EXPECT_THROW(BatchNorm(card_, params, bad), Error);
  bad = spec(4);
  bad.momentum = 1.0f;
  EXPECT_THROW(BatchNorm(card_, params, bad), Error);
}

}  // namespace
}  // namespace gpubox::trainer
