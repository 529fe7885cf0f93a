// Helpers shared by the trainer tests: seeded random host data and float64 central differences.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace gpubox::trainer::testing {

inline std::vector<float> random_vector(std::size_t n, std::mt19937_64& rng, float lo = -1.0f,
                                        float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// Values bounded away from zero (ReLU's kink) by at least `gap`.
inline std::vector<float> random_away_from_zero(std::size_t n, std::mt19937_64& rng, float gap) {
  std::vector<float> v = random_vector(n, rng, gap, 1.0f);
  std::bernoulli_distribution sign(0.5);
  for (float& x : v) x = sign(rng) ? x : -x;
  return v;
}

// d loss / d values[k] by central differences: values[k] is perturbed by +-eps, `loss` is
// evaluated in float64 from the float outputs, the value restored afterwards.
inline double central_difference(std::vector<float>& values, std::size_t k, float eps,
                                 const std::function<double()>& loss) {
  const float saved = values[k];
  values[k] = saved + eps;
  const double plus = loss();
  values[k] = saved - eps;
  const double minus = loss();
  values[k] = saved;
  const double h = static_cast<double>(saved + eps) - static_cast<double>(saved - eps);
  return (plus - minus) / h;
}

// Weighted sum of outputs in float64: the scalar "loss" whose gradient w.r.t. the outputs is
// `weights`.
inline double weighted_sum(const std::vector<float>& out, const std::vector<float>& weights) {
  double s = 0;
  for (std::size_t i = 0; i < out.size(); ++i) s += static_cast<double>(out[i]) * weights[i];
  return s;
}

// What a path whose GEMMs read bf16 operands keeps to its float64 reference, relative: each
// operand rounded once (relative error <= 2^-8 each, <= 2^-7 per product), `k`-term sums whose
// rounding errors add up as a random walk (sqrt(k)), times `margin` for the layers it passes.
inline double bf16_tolerance(int k, double margin) {
  return margin * std::sqrt(static_cast<double>(k)) * std::ldexp(1.0, -7);
}

inline void expect_gradient_near(double analytic, double numeric, double abs_tol, double rel_tol,
                                 const std::string& what) {
  EXPECT_NEAR(analytic, numeric, abs_tol + rel_tol * std::fabs(numeric)) << what;
}

// How expect_gradients_near differentiates (step eps) and what it allows (abs + rel |numeric|).
struct GradientCheck {
  float eps = 1e-2f;
  double abs_tol = 2e-3, rel_tol = 2e-3;
};

// A layer's backward against central differences of `loss`: each parameter of `blocks` (a
// DenseParameters' ParamBlocks over the values `w`; its gradient grads / scale) and each entry of
// the input rows x0 ([rows x cols], row stride ld; its gradient dx [rows x cols], dense).
// Returns how many parameters it checked.
template <class Blocks>
std::size_t expect_gradients_near(const Blocks& blocks, std::vector<float>& w,
                                  std::vector<float>& x0, const std::vector<float>& grads,
                                  const std::vector<float>& dx, float scale, int rows, int cols,
                                  int64_t ld, GradientCheck check,
                                  const std::function<double()>& loss) {
  std::size_t checked = 0;
  for (const auto& b : blocks) {
    for (std::size_t k = 0; k < b.count; ++k, ++checked) {
      const double numeric = central_difference(w, b.offset + k, check.eps, loss);
      expect_gradient_near(grads[b.offset + k] / scale, numeric, check.abs_tol, check.rel_tol,
                           b.name + "[" + std::to_string(k) + "]");
    }
  }
  for (int i = 0; i < rows; ++i) {
    for (int j = 0; j < cols; ++j) {
      const double numeric = central_difference(x0, i * ld + j, check.eps, loss);
      expect_gradient_near(dx[i * cols + j], numeric, check.abs_tol, check.rel_tol,
                           "input " + std::to_string(i) + "," + std::to_string(j));
    }
  }
  return checked;
}

}  // namespace gpubox::trainer::testing
