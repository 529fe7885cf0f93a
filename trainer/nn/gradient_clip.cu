#include "common/error.hpp"
#include "heterps/device/parallel_for.cuh"
#include "heterps/device/reduce.cuh"
#include "trainer/nn/gradient_clip.hpp"

namespace gpubox::trainer {
namespace {

struct GradSquare {
  const float* grads;
  GPUBOX_HD double operator()(std::size_t i) const {
    const double g = static_cast<double>(grads[i]);
    return g * g;
  }
};

struct SumDoubles {
  GPUBOX_HD double operator()(double a, double b) const { return a + b; }
};

// The step's inputs of NormClipState, written by the reduction's last thread.
struct BeginStep {
  heter_comm::NormClipState* state;
  float sparse_scale;
  float clip_norm;
  GPUBOX_HD void operator()(double squares) const {
    state->squares = squares;
    state->sparse_scale = sparse_scale;
    state->clip_norm = clip_norm;
  }
};

struct ScaleByFactor {
  float* grads;
  const heter_comm::NormClipState* state;
  GPUBOX_HD void operator()(std::size_t i) const {
    const float factor = state->factor;
    if (factor != 1.0f) grads[i] *= factor;
  }
};

}  // namespace

GradientClip::GradientClip(device::Card& card, float clip_norm, std::size_t trained)
    : card_(&card),
      clip_norm_(clip_norm),
      trained_(trained),
      state_(1, card.memory(), card.stream()),
      partials_(device::reduce_partials(trained), card.memory(), card.stream()) {
  GPUBOX_EXPECTS(clip_norm > 0.0f, "GradientClip: clip_norm must be > 0, got ", clip_norm);
}

void GradientClip::begin_step_async(const float* grads, int64_t global_batch) {
  const float sparse_scale = global_batch > 0 ? 1.0f / static_cast<float>(global_batch) : 0.0f;
  device::reduce_into_then(card_->stream(), trained_, GradSquare{grads}, SumDoubles{}, 0.0,
                           partials_.data(), BeginStep{state_.data(), sparse_scale, clip_norm_});
}

void GradientClip::scale_dense_async(float* grads) {
  device::parallel_for(card_->stream(), trained_, ScaleByFactor{grads, state_.data()});
}

}  // namespace gpubox::trainer
