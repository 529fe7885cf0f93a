// Dropout (dropout.hpp): the masks' keys, the in-place kernels and the step counter. Portable:
// parallel_for over a layer's units, the same hash on both backends.
#include <cmath>

#include "common/error.hpp"
#include "heterps/device/isa_clones.cuh"
#include "heterps/device/parallel_for.cuh"
#include "trainer/nn/bf16.hpp"
#include "trainer/nn/dense_model_types.hpp"
#include "trainer/nn/dropout.hpp"

namespace gpubox::trainer {
namespace {
// Unit i of a [rows x cols] block at row stride ld: y *= scale when kept, else y *= 0 (0 for a
// finite y; a NaN or inf stays NaN, as the non-finite check must see it). The step's key is read
// from card memory where the kernel runs (written by the step's advance), so a replayed graph
// reads the step it replays; a unit hashes once.
template <class T>
struct DropUnits {
  DropoutMask mask;
  const uint64_t* step_key;
  T* y;
  std::size_t cols;
  std::size_t ld;
  GPUBOX_HD void operator()(std::size_t i) const {
    const std::size_t row = i / cols;
    const std::size_t at = row * ld + (i - row * cols);
    const bool kept = mask.keeps(*step_key, i);
    const float v = to_float(y[at]);
    store_as(y + at, v * (kept ? mask.scale : 0.0f));
  }
#if !defined(GPUBOX_BACKEND_CUDA)
  // cpu: row by row (a division a row, not one a unit) with the step's key read once, so that the
  // units' hashes form a loop the AVX-512 clone runs 8 wide (isa_clones); the same products.
  void run_range(std::size_t begin, std::size_t end) const {
    // Locals: a store through `out` (a float) could otherwise be mask.scale's, re-read each unit.
    const DropoutMask m = mask;
    const uint64_t key = *step_key;
    T* const data = y;
    const std::size_t width = cols;
    const std::size_t stride = ld;
    device::for_row_segments(
        begin, end, static_cast<int>(width), [=](int64_t row, int64_t first, int64_t last) {
          T* out = data + static_cast<std::size_t>(row) * stride;
          const std::size_t base = static_cast<std::size_t>(row) * width;
          for (int64_t j = first; j < last; ++j) {
            const float factor = m.keeps(key, base + static_cast<std::size_t>(j)) ? m.scale : 0.0f;
            store_as(out + j, to_float(out[j]) * factor);
          }
        });
  }
#endif
};

// One thread: the step (advanced, or set to `value`) and every mask's key of it.
struct StepKeys {
  uint64_t* state;
  int masks;
  bool advance;
  uint64_t value;
  GPUBOX_HD void operator()(std::size_t) const {
    const uint64_t step = advance ? state[0] + 1 : value;
    state[0] = step;
    uint64_t* keys = dropout_step_keys(state, masks);
    for (int k = 0; k < masks; ++k) keys[k] = DropoutMask::step_key_of(state[1 + k], step);
  }
};
}  // namespace

uint64_t dropout_layer_key(uint64_t seed, int rank, int layer) {
  uint64_t key = dropout_mix(seed * DropoutMask::kGolden + 0x5D0B3A1F2C6E4897ull);
  key = dropout_mix(
      key ^ ((static_cast<uint64_t>(static_cast<uint32_t>(rank)) + 1) * 0xD6E8FEB86659FD93ull));
  return dropout_mix(
      key ^ ((static_cast<uint64_t>(static_cast<uint32_t>(layer)) + 1) * 0xA0761D6478BD642Full));
}

uint64_t dropout_trainer_seed(uint64_t seed, int trainer) {
  if (trainer == 0) return seed;
  return dropout_mix(
      seed ^ ((static_cast<uint64_t>(static_cast<uint32_t>(trainer)) + 1) * 0x8EBC6AF09C88C6E3ull));
}

DropoutMask make_dropout_mask(uint64_t seed, int rank, int layer, double keep) {
  GPUBOX_EXPECTS(keep > 0.0 && keep <= 1.0, "dropout keep probability ", keep, " outside (0, 1]");
  DropoutMask mask;
  mask.layer_key = dropout_layer_key(seed, rank, layer);
  mask.keep_below = static_cast<uint64_t>(std::llround(keep * 4294967296.0));
  mask.scale = static_cast<float>(1.0 / keep);
  GPUBOX_EXPECTS(mask.keep_below > 0, "dropout keep probability ", keep,
                 " rounds to 0 in 32 bits (hyper_parameters.dnn_dropout is at most 0.999)");
  return mask;
}

void apply_dropout_async(const device::Stream& stream, const DropoutMask& mask,
                         const uint64_t* step_key, void* y, ElementType type, int64_t rows,
                         int cols, int64_t ld) {
  const auto n = static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols);
  const auto c = static_cast<std::size_t>(cols);
  const auto stride = static_cast<std::size_t>(ld);
  if (type == ElementType::kBf16) {
    device::parallel_for(
        stream, n,
        device::isa_clones(DropUnits<Bf16>{mask, step_key, static_cast<Bf16*>(y), c, stride}));
  } else {
    device::parallel_for(
        stream, n,
        device::isa_clones(DropUnits<float>{mask, step_key, static_cast<float*>(y), c, stride}));
  }
}

void advance_dropout_step_async(const device::Stream& stream, uint64_t* state, int masks) {
  device::parallel_for(stream, 1, StepKeys{state, masks, true, 0});
}

void set_dropout_step_async(const device::Stream& stream, uint64_t* state, int masks,
                            uint64_t value) {
  device::parallel_for(stream, 1, StepKeys{state, masks, false, value});
}

MlpDropout::MlpDropout(device::Card& card, double p, uint64_t seed, const MlpDropoutShape& shape)
    : hidden_(shape.hidden), output_(shape.output), side_(shape.side) {
  // The float the config gives (0.999f is a little above 0.999).
  GPUBOX_EXPECTS(p >= 0.0 && static_cast<float>(p) <= 0.999f,
                 "hyper_parameters.dnn_dropout must be in [0, 0.999], got ", p);
  GPUBOX_EXPECTS(shape.hidden_dropouts >= 1, "dropout: ", shape.hidden_dropouts,
                 " Dropouts per hidden unit");
  state_ = card.make_buffer<uint64_t>(0);
  if (p == 0.0 || (hidden_ == 0 && !output_ && !side_)) return;
  // PaddleRec's Dropouts after the Linear and the ReLU (and flen's norm): a hidden unit kept by
  // every one.
  const double keep = 1.0 - p;
  // keep^n by products: keep * keep for 2, as before flen's third.
  const double hidden_keep = dropout_hidden_keep(p, shape.hidden_dropouts);
  GPUBOX_EXPECTS(hidden_ == 0 || hidden_keep >= kMinDropoutKeep, "hyper_parameters.dnn_dropout ", p,
                 ": a hidden unit passing ", shape.hidden_dropouts,
                 " Dropouts is kept with probability ", hidden_keep,
                 ", below 2^-20 (the mask's 32-bit threshold would misstate it)");
  for (int l = 0; l < hidden_; ++l) {
    masks_.push_back(make_dropout_mask(seed, card.rank(), l, hidden_keep));
  }
  masks_.push_back(make_dropout_mask(seed, card.rank(), hidden_, keep));  // the output's
  if (side_) masks_.push_back(make_dropout_mask(seed, card.rank(), hidden_ + 1, keep));
  // The state: step 0, the layer keys, their keys of step 0 (set by the kernel).
  const int masks = static_cast<int>(masks_.size());
  std::vector<uint64_t> state(dropout_state_words(masks), 0);
  for (int k = 0; k < masks; ++k) state[1 + k] = masks_[k].layer_key;
  state_ = device::to_device(state, card.memory(), card.stream());
  set_dropout_step_async(card.stream(), state_.data(), masks, 0);
}

void MlpDropout::begin_step(const device::Stream& stream) {
  if (on()) advance_dropout_step_async(stream, state_.data(), static_cast<int>(masks_.size()));
}

void MlpDropout::set_steps(const device::Stream& stream, uint64_t steps) {
  if (on()) set_dropout_step_async(stream, state_.data(), static_cast<int>(masks_.size()), steps);
}

void MlpDropout::hidden_forward(const device::Stream& stream, std::size_t l, void* y,
                                ElementType type, int64_t rows, int cols, int64_t ld) const {
  if (!on()) return;
  apply_dropout_async(stream, masks_.at(l), step_key(l), y, type, rows, cols, ld);
}

void MlpDropout::output_forward(const device::Stream& stream, float* logits, int64_t rows) const {
  if (!drops_output()) return;
  apply_dropout_async(stream, masks_.at(hidden_), step_key(hidden_), logits, ElementType::kF32,
                      rows, 1, 1);
}

void MlpDropout::output_backward(const device::Stream& stream, void* dz, ElementType type,
                                 int64_t rows) const {
  if (!drops_output()) return;
  // d(m y / q)/dy = m / q: the same units, the same scale.
  apply_dropout_async(stream, masks_.at(hidden_), step_key(hidden_), dz, type, rows, 1, 1);
}

void MlpDropout::side_forward(const device::Stream& stream, float* y, int64_t rows, int cols,
                              int64_t ld) const {
  if (!drops_side()) return;
  apply_dropout_async(stream, masks_.at(hidden_ + 1), step_key(hidden_ + 1), y, ElementType::kF32,
                      rows, cols, ld);
}

}  // namespace gpubox::trainer
