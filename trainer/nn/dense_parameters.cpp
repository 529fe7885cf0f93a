#include "trainer/nn/dense_parameters.hpp"

#include <algorithm>
#include <cmath>

#include "common/error.hpp"
#include "common/hash.hpp"

namespace gpubox::trainer {
namespace {
constexpr std::size_t kBlockAlign = 16;

// Standard normal from two hashed uniforms (Box-Muller): the same on every machine and card,
// unlike std::normal_distribution whose algorithm is implementation-defined.
float normal_at(uint64_t seed, uint64_t index) {
  const uint64_t a = hash_with_seed(2 * index, seed);
  const uint64_t b = hash_with_seed(2 * index + 1, seed);
  const double u1 = (static_cast<double>(a >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
  const double u2 = static_cast<double>(b >> 11) * 0x1.0p-53;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}
}  // namespace

std::size_t DenseParameters::add(std::string name, std::size_t count, ParamInit init, float scale) {
  GPUBOX_EXPECTS(!finalized_, "parameter block '", name, "' added after finalize()");
  ParamBlock block;
  block.name = std::move(name);
  block.offset = (total_ + kBlockAlign - 1) / kBlockAlign * kBlockAlign;
  block.count = count;
  block.init = init;
  block.scale = scale;
  total_ = block.offset + count;
  blocks_.push_back(std::move(block));
  return blocks_.size() - 1;
}

std::size_t DenseParameters::add_statistic(std::string name, std::size_t count, ParamInit init) {
  GPUBOX_EXPECTS(!finalized_, "statistic block '", name, "' added after finalize()");
  ParamBlock block;
  block.name = std::move(name);
  block.count = count;
  block.init = init;
  block.statistic = true;  // its offset: finalize()
  blocks_.push_back(std::move(block));
  return blocks_.size() - 1;
}

void DenseParameters::keep_bf16_copy() {
  GPUBOX_EXPECTS(!finalized_, "keep_bf16_copy() after finalize()");
  keep_bf16_ = true;
}

void DenseParameters::refresh_bf16_copy() {
  if (keep_bf16_) to_bf16_async(card_->stream(), values_.data(), total_, values_bf16_.data());
}

void DenseParameters::finalize(uint64_t seed) {
  GPUBOX_EXPECTS(!finalized_, "DenseParameters finalized twice");
  trained_ = total_;
  for (ParamBlock& block : blocks_) {
    if (!block.statistic) continue;
    block.offset = (total_ + kBlockAlign - 1) / kBlockAlign * kBlockAlign;
    total_ = block.offset + block.count;
  }
  std::vector<float> host(total_, 0.0f);
  for (const ParamBlock& block : blocks_) {
    if (block.init == ParamInit::kOne) std::fill_n(host.begin() + block.offset, block.count, 1.0f);
    if (block.init != ParamInit::kNormal) continue;
    for (std::size_t i = 0; i < block.count; ++i) {
      host[block.offset + i] = block.scale * normal_at(seed, block.offset + i);
    }
  }
  values_ = device::to_device(host, card_->memory(), card_->stream());
  // Zeroed gradients plus the loss and stop slots (reduced_size()).
  grads_ =
      device::to_device(std::vector<float>(reduced_size(), 0.0f), card_->memory(), card_->stream());
  if (keep_bf16_) values_bf16_ = card_->make_buffer<Bf16>(total_);
  finalized_ = true;
  refresh_bf16_copy();
}

std::string DenseParameters::describe(std::size_t flat_index) const {
  for (const ParamBlock& block : blocks_) {
    if (flat_index >= block.offset && flat_index < block.offset + block.count) {
      return block.name + "[" + std::to_string(flat_index - block.offset) + "]";
    }
  }
  return "padding[" + std::to_string(flat_index) + "]";
}

std::vector<float> DenseParameters::values_to_host() const { return device::to_host(values_); }
std::vector<float> DenseParameters::grads_to_host() const {
  return device::to_host(grads_.data(), total_, grads_.stream());
}

void DenseParameters::set_values(const std::vector<float>& host) {
  set_values(host.data(), host.size());
}

void DenseParameters::set_values(const float* host, std::size_t count) {
  GPUBOX_EXPECTS(finalized_ && count == total_, "set_values with ", count,
                 " floats, the model has ", total_);
  if (total_ > 0) device::copy_async(values_.data(), host, total_, card_->stream());
  refresh_bf16_copy();
  card_->stream().synchronize();
}

}  // namespace gpubox::trainer
