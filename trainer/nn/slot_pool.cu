#include "common/error.hpp"
#include "heterps/device/parallel_for.cuh"
#include "trainer/nn/device_math.cuh"
#include "trainer/nn/layers.hpp"

namespace gpubox::trainer {
namespace {
// One work item per (slot, instance) segment: it owns its output block and its occurrences'
// push records, so no atomics are needed.
struct PoolForward {
  const float* records;
  const uint32_t* offsets;
  float* pooled;
  int64_t batch;
  int pull_dim;
  int width;
  int out_dim;
  int cvm_columns;  // 2 with use_cvm, else 0
  GPUBOX_HD void operator()(std::size_t segment) const {
    const int64_t s = static_cast<int64_t>(segment) / batch;
    const int64_t i = static_cast<int64_t>(segment) % batch;
    float* out = pooled + i * out_dim + s * width;
    const int values = pull_dim - 2;  // embed_w, embedx_w[mf_dim]
    float* sums = out + cvm_columns;
    for (int k = 0; k < values; ++k) sums[k] = 0.0f;
    float show = 0.0f;
    float click = 0.0f;
    for (uint32_t j = offsets[segment]; j < offsets[segment + 1]; ++j) {
      const float* rec = records + static_cast<int64_t>(j) * pull_dim;
      show += rec[0];
      click += rec[1];
      for (int k = 0; k < values; ++k) sums[k] += rec[2 + k];
    }
    if (cvm_columns == 2) {
      const float log_show = detail::log1p_f(show);
      out[0] = log_show;
      out[1] = detail::log1p_f(click) - log_show;
    }
  }
};

struct PoolBackward {
  const uint32_t* offsets;
  const float* d_pooled;
  const float* labels;
  float* push;
  float scale;
  int64_t batch;
  int push_dim;
  int width;
  int out_dim;
  int cvm_columns;
  GPUBOX_HD void operator()(std::size_t segment) const {
    const int64_t s = static_cast<int64_t>(segment) / batch;
    const int64_t i = static_cast<int64_t>(segment) % batch;
    const float* grad = d_pooled + i * out_dim + s * width + cvm_columns;
    const float label = labels[i];
    const int values = push_dim - 2;
    for (uint32_t j = offsets[segment]; j < offsets[segment + 1]; ++j) {
      float* rec = push + static_cast<int64_t>(j) * push_dim;
      rec[0] = 1.0f;
      rec[1] = label;
      for (int k = 0; k < values; ++k) rec[2 + k] = scale * grad[k];
    }
  }
};
}  // namespace

SlotSumPool::SlotSumPool(int slots, int mf_dim, bool use_cvm)
    : slots_(slots), mf_dim_(mf_dim), use_cvm_(use_cvm) {
  GPUBOX_EXPECTS(slots > 0 && mf_dim >= 0, "slot pool needs slots > 0 and mf_dim >= 0, got ", slots,
                 " slots, mf_dim ", mf_dim);
}

void SlotSumPool::forward(const device::Stream& stream, const SlotBatchView& in,
                          float* pooled) const {
  GPUBOX_EXPECTS(in.slots == slots_, "batch has ", in.slots, " slots, the model ", slots_);
  if (in.batch == 0) return;
  device::parallel_for(stream, static_cast<std::size_t>(in.batch) * slots_,
                       PoolForward{in.records, in.offsets, pooled, in.batch, pull_dim(), width(),
                                   out_dim(), use_cvm_ ? 2 : 0});
}

void SlotSumPool::backward(const device::Stream& stream, const SlotBatchView& in,
                           const float* d_pooled, const float* labels, float scale,
                           float* push) const {
  GPUBOX_EXPECTS(in.slots == slots_, "batch has ", in.slots, " slots, the model ", slots_);
  if (in.batch == 0) return;
  device::parallel_for(stream, static_cast<std::size_t>(in.batch) * slots_,
                       PoolBackward{in.offsets, d_pooled, labels, push, scale, in.batch, push_dim(),
                                    width(), out_dim(), use_cvm_ ? 2 : 0});
}

}  // namespace gpubox::trainer
