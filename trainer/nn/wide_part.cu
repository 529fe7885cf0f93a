#include <type_traits>

#include "common/error.hpp"
#include "heterps/device/parallel_for.cuh"
#include "trainer/nn/bf16.hpp"
#include "trainer/nn/layers.hpp"

namespace gpubox::trainer {
namespace {
// T: the element type of the first layer's input rows, where the pooled embed_w are.
template <class T>
struct WideForward {
  const T* rows;
  int64_t ld;
  const float* dense;
  const float* weights;
  float* logits;
  SlotBlocks blocks;
  int slots;
  int embed_w_column;
  int dense_dim;
  GPUBOX_HD void operator()(std::size_t i) const {
    const T* row = rows + static_cast<int64_t>(i) * ld + embed_w_column;
    float sum = 0.0f;
    for (int s = 0; s < slots; ++s) sum += to_float(row[blocks.begin(s)]);
    const float* x = dense + static_cast<int64_t>(i) * dense_dim;
    for (int d = 0; d < dense_dim; ++d) sum += x[d] * weights[d];
    logits[i] += sum;
  }
};
struct WideBackward {
  const float* dlogits;
  float* d_pooled;
  int64_t d_ld;
  SlotBlocks blocks;
  int slots;
  int embed_w_column;
  GPUBOX_HD void operator()(std::size_t i) const {
    float* row = d_pooled + static_cast<int64_t>(i) * d_ld + embed_w_column;
    for (int s = 0; s < slots; ++s) row[blocks.begin(s)] += dlogits[i];
  }
};
}  // namespace

WidePart::WidePart(DenseParameters& params, const SlotSumPool& pool, int dense_dim)
    : blocks_(pool.blocks()),
      slots_(pool.slots()),
      embed_w_column_(pool.embed_w_column()),
      dense_dim_(dense_dim) {
  GPUBOX_EXPECTS(dense_dim >= 0, "wide part: dense_dim must be >= 0, got ", dense_dim);
  w_ = params.add("wide.dense_w", static_cast<std::size_t>(dense_dim), ParamInit::kZero);
}

void WidePart::forward(const device::Stream& stream, const DenseParameters& params,
                       const InputRows& input, const float* dense, int64_t batch,
                       float* logits) const {
  auto launch = [&](const auto* rows) {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(rows)>>;
    device::parallel_for(stream, static_cast<std::size_t>(batch),
                         WideForward<T>{rows, input.ld, dense, params.values(w_), logits, blocks_,
                                        slots_, embed_w_column_, dense_dim_});
  };
  if (input.type == ElementType::kBf16) {
    launch(static_cast<const Bf16*>(input.data));
  } else {
    launch(static_cast<const float*>(input.data));
  }
}

void WidePart::backward(const Blas& blas, DenseParameters& params, const float* dense,
                        const float* dlogits, int64_t batch, float grad_scale, float* d_pooled,
                        int64_t d_ld) const {
  device::parallel_for(blas.stream(), static_cast<std::size_t>(batch),
                       WideBackward{dlogits, d_pooled, d_ld, blocks_, slots_, embed_w_column_});
  blas.sgemv(Transpose::kYes, batch, dense_dim_, grad_scale, dense, dense_dim_, dlogits, 0.0f,
             params.grads(w_));
}

}  // namespace gpubox::trainer
