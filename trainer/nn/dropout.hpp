// Inverted dropout for the dense net's hidden layers (hyper_parameters.dnn_dropout), as PaddleRec's
// DNNs use it: a Dropout(p) after every Linear and after every ReLU of a hidden layer. Both are
// applied to one unit in turn (relu(d1(z)) = d1(relu(z)): the scale is positive), so a hidden unit
// is kept with probability q = (1-p)^2 and scaled by 1/q: the same distribution as one mask of
// keep probability q, which is what is built (dcn_v2's p = 0.5 keeps a quarter, scaled by 4).
// flen's DNN has a third Dropout after every hidden layer's batch norm: built without the norm, a
// unit passes three, q = (1-p)^3 (MlpDropoutShape::hidden_dropouts). deepfefm's and fat_deepffm's
// DNN drops its 1-wide output too (keep 1-p), flen its bi-interaction's ReLU'd layer (keep 1-p,
// the side mask: FlenPart applies it).
//
// In training only: evaluation, prediction, export and serving run the net as it is (inverted
// dropout needs no scale there). The stored hidden output is A' = relu(z) m / q, so A' > 0 iff
// z > 0 and m = 1, and the gradient to z is dA' [A' > 0] / q: the ReLU mask the next layer's
// input-gradient GEMM applies to its producer's output (LinearGemmSpec::input_is_relu) with alpha
// 1/q, read from the stored A' (LinearGemmSpec::input_rewritten: on CUDA the GEMM and then the
// x > 0 mask kernel, not DRELU's fused epilogue over the forward's recorded bit mask, which would
// let dropped units through; the dropped layer's forward records none). No mask buffer, no RNG
// state.
//
// The mask: a counter-based hash of (seed, card rank, layer, step, row, column), the same
// __host__ __device__ function on both backends, so cpu and CUDA masks are equal bit for bit.
// The step is a counter in card memory that the training step itself advances (a captured step
// graph reads it at replay, as DenseOptimizer's Adam step count), so every replay draws a new
// mask (the same kernel writes each mask's key of the step beside it, which the units read); the
// card's global rank makes every card's masks its own (in the PS modes, whose trainers rank their
// cards from 0, with the trainer's id mixed into the seed: dropout_trainer_seed).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/macros.hpp"
#include "heterps/device/card.hpp"
#include "heterps/device/memory.hpp"
#include "heterps/device/stream.hpp"
#include "trainer/nn/linear_gemms.hpp"

namespace gpubox::trainer {

// splitmix64's output function: a bijection of 64-bit words whose outputs over consecutive
// inputs pass the usual statistical batteries.
GPUBOX_HD GPUBOX_FORCEINLINE uint64_t dropout_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// One layer's mask. Trivially copyable (a kernel argument).
struct DropoutMask {
  static constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;
  uint64_t layer_key = 0;   // of (seed, card rank, layer): dropout_layer_key
  uint64_t keep_below = 0;  // a unit is kept when its hash's upper 32 bits are below this
  float scale = 1.0f;       // 1 / keep probability, as a float (forward and backward use it)

  // The key of one step: its units are splitmix64's sequence from it.
  GPUBOX_HD GPUBOX_FORCEINLINE uint64_t step_key(uint64_t step) const {
    return step_key_of(layer_key, step);
  }
  static GPUBOX_HD GPUBOX_FORCEINLINE uint64_t step_key_of(uint64_t layer_key, uint64_t step) {
    return dropout_mix(layer_key ^ dropout_mix(step * kGolden + kGolden));
  }
  // Whether unit `element` (row * cols + column, of the card's batch) is kept at `step_key`.
  GPUBOX_HD GPUBOX_FORCEINLINE bool keeps(uint64_t step_key, uint64_t element) const {
    return (dropout_mix(step_key + (element + 1) * kGolden) >> 32) < keep_below;
  }
};

// The key of (seed, card rank, layer).
uint64_t dropout_layer_key(uint64_t seed, int rank, int layer);
// A mask keeping each unit with probability `keep` in (0, 1] (rounded to a multiple of 2^-32);
// its scale is 1 / keep.
DropoutMask make_dropout_mask(uint64_t seed, int rank, int layer, double keep);

// The masks' seed of PS trainer `trainer` (DenseModelConfig::dropout_trainer): `seed` for trainer
// 0, a mix of both for the others (their cards' ranks repeat trainer 0's).
uint64_t dropout_trainer_seed(uint64_t seed, int trainer);

// The step state on the card of `masks` masks: word 0 the step, words 1..masks their layer keys
// (written once), words masks+1..2 masks their keys of the step (dropout_step_keys), which the
// step's kernels write, so a unit's kernel reads its mask's key instead of hashing it per unit.
inline std::size_t dropout_state_words(int masks) {
  return 1 + 2 * static_cast<std::size_t>(masks);
}
// (__host__ __device__: the step kernel writes through it.)
GPUBOX_HD GPUBOX_FORCEINLINE uint64_t* dropout_step_keys(uint64_t* state, int masks) {
  return state + 1 + masks;
}
GPUBOX_HD GPUBOX_FORCEINLINE const uint64_t* dropout_step_keys(const uint64_t* state, int masks) {
  return state + 1 + masks;
}

// y[r, c] = y[r, c] * scale when kept at the step whose key is *step_key, else 0, for r < rows,
// c < cols (row stride ld, of `type`; padding untouched). Enqueued; reads *step_key (card memory,
// mask.step_key(step) as advance_dropout_step_async writes it) when it runs.
void apply_dropout_async(const device::Stream& stream, const DropoutMask& mask,
                         const uint64_t* step_key, void* y, ElementType type, int64_t rows,
                         int cols, int64_t ld);
// In `state` (dropout_state_words(masks), layer keys set): the step += 1 and every mask's key of
// it (enqueued, one launch: a captured step advances it at every replay).
void advance_dropout_step_async(const device::Stream& stream, uint64_t* state, int masks);
// The step = value and every mask's key of it (enqueued, one launch).
void set_dropout_step_async(const device::Stream& stream, uint64_t* state, int masks,
                            uint64_t value);

// What a network's PaddleRec net drops (DenseModel::add_dropout).
struct MlpDropoutShape {
  int hidden = 0;           // the hidden layers whose ReLU output is dropped
  int hidden_dropouts = 2;  // PaddleRec's Dropouts a hidden unit passes: after the Linear and the
                            // ReLU (2), flen's after its batch norm too (3): keep (1-p)^this
  bool output = false;      // the DNN's 1-wide output (keep 1-p): deepfefm, fat_deepffm
  bool side = false;        // a ReLU'd layer beside the DNN (keep 1-p): flen's bi-interaction
};

// The DenseModel's dropout: a mask per hidden layer and the step counter on the card. Off (no
// kernel, no counter: today's net bit for bit) when p = 0. Thread-safety: the card's thread.
class MlpDropout {
 public:
  // `p`: hyper_parameters.dnn_dropout, 0 <= p <= 0.999. Masks' layers: hidden l is l, the output
  // shape.hidden, the side layer shape.hidden + 1.
  MlpDropout(device::Card& card, double p, uint64_t seed, const MlpDropoutShape& shape);
  bool on() const { return !masks_.empty(); }
  // Training forward's first step: the counter moves on (enqueued).
  void begin_step(const device::Stream& stream);
  // Sets the steps taken (the next training forward draws step `steps` + 1). Enqueued.
  void set_steps(const device::Stream& stream, uint64_t steps);
  const uint64_t* step() const { return state_.data(); }
  // Hidden layer l's mask (l < the hidden count); the output's after them, then the side's.
  const DropoutMask& mask(std::size_t l) const { return masks_.at(l); }
  // Drops hidden layer l's ReLU output in place (no-op when off).
  void hidden_forward(const device::Stream& stream, std::size_t l, void* y, ElementType type,
                      int64_t rows, int cols, int64_t ld) const;
  // The alpha of the input-gradient GEMM reading hidden layer l's output: 1/q, or 1 when off.
  float hidden_grad_scale(std::size_t l) const { return on() ? masks_.at(l).scale : 1.0f; }
  bool drops_output() const { return on() && output_; }
  // The hidden layers dropped (mask(0) is the output's when 0).
  int hidden() const { return hidden_; }
  // The 1-wide output (logits, fp32) in place, and the MLP's top gradient dz (`type`, [rows])
  // through the same mask. No-op unless drops_output().
  void output_forward(const device::Stream& stream, float* logits, int64_t rows) const;
  void output_backward(const device::Stream& stream, void* dz, ElementType type,
                       int64_t rows) const;
  bool drops_side() const { return on() && side_; }
  // The side layer's ReLU output ([rows x cols] fp32, row stride ld) in place; no-op unless
  // drops_side(). Its gradient is the stored output's x > 0 mask times side_grad_scale().
  void side_forward(const device::Stream& stream, float* y, int64_t rows, int cols,
                    int64_t ld) const;
  float side_grad_scale() const { return drops_side() ? masks_.at(hidden_ + 1).scale : 1.0f; }

 private:
  int hidden_ = 0;
  bool output_ = false;
  bool side_ = false;
  // Mask k's key of the current step (card memory).
  const uint64_t* step_key(std::size_t k) const {
    return dropout_step_keys(state_.data(), static_cast<int>(masks_.size())) + k;
  }
  std::vector<DropoutMask> masks_;
  device::device_buffer<uint64_t> state_;  // dropout_state_words(masks_.size())
};

}  // namespace gpubox::trainer
