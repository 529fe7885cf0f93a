#include <cmath>

#include "common/error.hpp"
#include "trainer/nn/layers.hpp"

namespace gpubox::trainer {
Linear::Linear(DenseParameters& params, const std::string& name, int in, int out)
    : in_(in), out_(out) {
  GPUBOX_EXPECTS(in > 0 && out > 0, "layer ", name, ": sizes must be positive, got ", in, " x ",
                 out);
  // N(0, 1/in): unit-variance pre-activations for unit-variance inputs (Paddle's DNN uses the same
  // normal scale for its fc layers).
  w_ = params.add(name + ".w", static_cast<std::size_t>(in) * out, ParamInit::kNormal,
                  1.0f / std::sqrt(static_cast<float>(in)));
  b_ = params.add(name + ".b", static_cast<std::size_t>(out), ParamInit::kZero);
}

void Linear::forward(const Blas& blas, const DenseParameters& params, const float* x, int64_t batch,
                     const float* ones, float* y) const {
  if (batch == 0) return;
  // Y = 1 b^T (a rank-1 product: the bias broadcast, as fast as the BLAS makes it on either
  // backend), then Y += X W.
  blas.sgemm(Transpose::kNo, Transpose::kNo, batch, out_, 1, 1.0f, ones, 1, params.values(b_), out_,
             0.0f, y, out_);
  blas.sgemm(Transpose::kNo, Transpose::kNo, batch, out_, in_, 1.0f, x, in_, params.values(w_),
             out_, 1.0f, y, out_);
}

void Linear::backward(const Blas& blas, DenseParameters& params, const float* x, const float* dy,
                      int64_t batch, float grad_scale, const float* ones, float* dx) const {
  // With batch == 0 these are zero-size products: dW and db become zero (beta = 0).
  blas.sgemm(Transpose::kYes, Transpose::kNo, in_, out_, batch, grad_scale, x, in_, dy, out_, 0.0f,
             params.grads(w_), out_);
  blas.sgemv(Transpose::kYes, batch, out_, grad_scale, dy, out_, ones, 0.0f, params.grads(b_));
  if (dx != nullptr && batch > 0) {
    blas.sgemm(Transpose::kNo, Transpose::kYes, batch, in_, out_, 1.0f, dy, out_, params.values(w_),
               out_, 0.0f, dx, in_);
  }
}

}  // namespace gpubox::trainer
