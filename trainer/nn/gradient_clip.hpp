// GradientClip: one card's clipping by global norm (PaddleRec's
// hyper_parameters.optimizer.clip_by_norm, Paddle's ClipGradByGlobalNorm): every gradient of the
// step, the dense parameters' and the embedding rows', times clip_norm / max(clip_norm,
// global_norm), global_norm = sqrt(the sum of squares of all of them), before the optimizers (and
// so before their weight decays, as Paddle's). The norm is that of the mean loss's gradient over
// the step's global batch, as Paddle's: the dense gradients are already of the mean, a sparse one
// (each key's, summed over every card's occurrences of it, as the owner merges it) joins at
// 1 / global batch.
//
// In the step, all on the card (capturable, no host wait):
//   begin_step_async after the dense all-reduce (every card: the same squares) -> the sparse
//   push with state() (HeterComm::push_pulled adds the merged keys' squares, over all cards, and
//   writes the factor, which scales the sparse updates) -> scale_dense_async -> the dense step.
//
// Ownership: owns its state and partials (card memory). Thread-safety: one card's thread.
#pragma once

#include <cstddef>
#include <cstdint>

#include "heterps/device/card.hpp"
#include "heterps/device/memory.hpp"
#include "heterps/heter_comm/heter_comm_types.hpp"

namespace gpubox::trainer {

class GradientClip {
 public:
  // `clip_norm` > 0; `trained`: the dense gradients that join the norm and are scaled (the
  // trained parameters', DenseParameters::trained_size: not batch norm's statistics).
  GradientClip(device::Card& card, float clip_norm, std::size_t trained);

  float clip_norm() const { return clip_norm_; }
  // The squares of grads[0, trained) and the step's sparse scale (1 / global_batch; 0 for an
  // empty step) into state(). After the dense all-reduce.
  void begin_step_async(const float* grads, int64_t global_batch);
  // Where push_pulled reads its inputs and writes the factor.
  heter_comm::NormClipState* state() { return state_.data(); }
  // grads[0, trained) *= the factor. After push_pulled, before the dense optimizer.
  void scale_dense_async(float* grads);

 private:
  device::Card* card_;
  float clip_norm_;
  std::size_t trained_;
  device::device_buffer<heter_comm::NormClipState> state_;  // 1 element
  device::device_buffer<double> partials_;                  // the squares' reduction
};

}  // namespace gpubox::trainer
