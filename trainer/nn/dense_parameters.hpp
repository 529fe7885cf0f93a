// All dense parameters of a model in ONE contiguous card buffer, and their gradients in a second
// one with the same layout, so the per-step gradient all-reduce across cards is a single
// communicator call and the optimizer is a single elementwise pass.
//
// Use: layers register named blocks (add) while the model is built, then finalize() allocates and
// initialises the values. Initial values are a seeded hash of (seed, flat index), so every card
// (and every run) starts from identical weights without a broadcast.
//
// bf16 (hyper_parameters.dense_precision): the values are the fp32 master weights; a model whose
// GEMMs read bf16 asks for a bf16 copy of them (keep_bf16_copy), same layout, rewritten from the
// values by finalize, set_values, refresh_bf16_copy and the optimizer step (which writes both in
// one pass). Code that writes values() directly calls refresh_bf16_copy() after.
//
// Ownership: owns its buffers (card memory of the card given at construction). Not thread-safe:
// used by that card's thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "heterps/device/card.hpp"
#include "heterps/device/memory.hpp"
#include "trainer/nn/bf16.hpp"

namespace gpubox::trainer {

enum class ParamInit {
  kZero,
  kNormal,  // N(0, scale^2)
  kOne,     // 1 (xdeepfm's dense feature embeddings, as PaddleRec's)
};

struct ParamBlock {
  std::string name;        // e.g. "fc_0.w"
  std::size_t offset = 0;  // in floats, into values()/grads()
  std::size_t count = 0;
  ParamInit init = ParamInit::kZero;
  float scale = 0.0f;
  // A statistic (batch norm's running mean and variance): model state that is saved, loaded,
  // exchanged and served like a weight, but not trained. Its "gradient" slot holds the step's
  // change of the value, weighted by the card's share of the global batch, so that the gradient
  // all-reduce averages the cards' changes and the optimizer adds the result (DenseOptimizer).
  bool statistic = false;
};

class DenseParameters {
 public:
  explicit DenseParameters(device::Card& card) : card_(&card) {}
  DenseParameters(DenseParameters&&) = default;
  DenseParameters& operator=(DenseParameters&&) = default;

  // Registers a block; returns its id. Only before finalize(). Blocks are aligned to 16 floats
  // (64 bytes) so each starts on its own cache line / GPU sector.
  std::size_t add(std::string name, std::size_t count, ParamInit init, float scale = 0.0f);
  // Registers a statistic block (ParamBlock::statistic); returns its id. Only before finalize(),
  // which places every statistic after every trained block: [0, trained_size()) is what the
  // optimizer's rule steps, [trained_size(), size()) the statistics. A model without statistics
  // keeps the layout it had before they existed.
  std::size_t add_statistic(std::string name, std::size_t count, ParamInit init);
  // Before finalize(): also keep a bf16 copy of the values (see the file comment).
  void keep_bf16_copy();
  // Allocates values and grads (grads zeroed) and initialises the values from `seed`.
  void finalize(uint64_t seed);
  bool finalized() const { return finalized_; }

  float* values(std::size_t block) { return values_.data() + blocks_.at(block).offset; }
  const float* values(std::size_t block) const { return values_.data() + blocks_.at(block).offset; }
  float* grads(std::size_t block) { return grads_.data() + blocks_.at(block).offset; }
  const float* grads(std::size_t block) const { return grads_.data() + blocks_.at(block).offset; }
  // The bf16 copy (keep_bf16_copy): size() elements, nullptr data when not kept.
  bool has_bf16_copy() const { return keep_bf16_; }
  const Bf16* values_bf16(std::size_t block) const {
    return values_bf16_.data() + blocks_.at(block).offset;
  }
  device::device_buffer<Bf16>& values_bf16() { return values_bf16_; }
  // Rewrites the bf16 copy from the values (enqueued; no-op without a copy).
  void refresh_bf16_copy();

  // The flat buffers (size() floats each; alignment gaps are zero in both and stay zero). The
  // gradient buffer holds two floats more: the loss slot and the stop slot, see reduced_size().
  device::device_buffer<float>& values() { return values_; }
  const device::device_buffer<float>& values() const { return values_; }
  device::device_buffer<float>& grads() { return grads_; }
  const device::device_buffer<float>& grads() const { return grads_; }
  std::size_t size() const { return total_; }
  // The trained blocks' extent: the statistics follow it (add_statistic). size() without any.
  std::size_t trained_size() const { return trained_; }
  // The training step all-reduces reduced_size() = size() + 2 floats of grads(): the gradients
  // and, after them, the loss slot where each card puts its batch loss. After the all-reduce the
  // slot holds the loss summed over the cards, so one finite check over the reduced buffer tells
  // every card, in the same collective, whether any card's loss or any gradient is non-finite.
  // The stop slot after it holds each card's stop vote (0 or 1; a caller asked the run to stop):
  // reduced, it is the number of cards that voted, the same on every card, so the cards of the
  // job stop together after the same step without a collective of their own.
  std::size_t reduced_size() const { return total_ + 2; }
  float* loss_slot() { return grads_.data() + total_; }
  const float* stop_slot() const { return grads_.data() + total_ + 1; }

  const std::vector<ParamBlock>& blocks() const { return blocks_; }
  // "fc_1.w[37]" for a flat index (errors name the parameter, not an offset).
  std::string describe(std::size_t flat_index) const;

  // Host copies / restore (tests, save/load). Sizes are size() (the loss slot is not included).
  std::vector<float> values_to_host() const;
  std::vector<float> grads_to_host() const;
  void set_values(const std::vector<float>& host);
  // The same from `count` (== size()) floats in pinned host memory (a step's path: the copy does
  // not block the thread as a pageable one does). Returns when the card holds them.
  void set_values(const float* pinned, std::size_t count);

 private:
  device::Card* card_;
  std::vector<ParamBlock> blocks_;
  std::size_t total_ = 0;
  std::size_t trained_ = 0;  // set by finalize()
  bool finalized_ = false;
  bool keep_bf16_ = false;
  device::device_buffer<float> values_;
  device::device_buffer<float> grads_;
  device::device_buffer<Bf16> values_bf16_;
};

}  // namespace gpubox::trainer
