// XdeepfmPart (xdeepfm_part.hpp): its blocks and buffers; the CIN's kernels are in cin.cu.
#include "trainer/nn/xdeepfm_part.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <sstream>

#include "common/error.hpp"
#include "trainer/nn/activation_layout.hpp"

namespace gpubox::trainer {
XdeepfmPart::XdeepfmPart(device::Card& card, DenseParameters& params, const SlotSumPool& pool,
                         const DenseModelConfig& config)
    : slots_(pool.slots()),
      dense_dim_(config.dense_dim),
      width_(pool.mf_dim()),
      use_cvm_(pool.use_cvm()),
      slot_width_(pool.width()),
      embedx_column_(pool.embed_w_column() + 1),
      sizes_(config.cin_layer_sizes) {
  GPUBOX_EXPECTS(pool.uniform(),
                 "xdeepfm's CIN multiplies the fields' embeddings value by value, so every slot "
                 "must be as wide as sparse_feature_dim, but hyper_parameters.slot_dims gives the "
                 "slots different widths; remove slot_dims, or train dnn, wide_deep or dcn_v2");
  GPUBOX_EXPECTS(!sizes_.empty(),
                 "xdeepfm: hyper_parameters.layer_sizes_cin is empty (the CIN needs a layer)");
  for (int size : sizes_) {
    GPUBOX_EXPECTS(size > 0, "xdeepfm: hyper_parameters.layer_sizes_cin has ", size);
  }
  dnn_ld_ = activation_ld(dnn_in());
  for (std::size_t k = 0; k < sizes_.size(); ++k) {
    const int64_t in = layer_in(static_cast<int>(k));
    // PaddleRec's 1x1 conv: N(0, 1 / (F H_k)).
    w_.push_back(params.add("cin_" + std::to_string(k) + ".w",
                            static_cast<std::size_t>(in) * static_cast<std::size_t>(sizes_[k]),
                            ParamInit::kNormal, 1.0f / std::sqrt(static_cast<float>(in))));
  }
  const int sum = pooled_cols();
  w_out_ = params.add("cin_out.w", static_cast<std::size_t>(sum), ParamInit::kNormal,
                      0.1f / std::sqrt(static_cast<float>(sum)));
  if (dense_dim_ > 0) {
    dense_w_ = params.add("xdeepfm.dense_w", static_cast<std::size_t>(dense_dim_) * width_,
                          ParamInit::kOne);
  }
  xs_.resize(sizes_.size());
  for (auto& buffer : xs_) buffer = card.make_buffer<float>(0);
  for (auto* buffer : {&x0_, &z_, &pooled_, &d_pooled_cin_, &g_a_, &g_b_, &dx0_}) {
    *buffer = card.make_buffer<float>(0);
  }
}

int XdeepfmPart::pooled_cols() const { return std::accumulate(sizes_.begin(), sizes_.end(), 0); }

double XdeepfmPart::flops_per_example() const {
  double macs = 0.0;
  for (std::size_t k = 0; k < sizes_.size(); ++k) {
    // forward Z W, weight gradient Z^T G, input gradient G W^T: D rows per example each.
    macs += 3.0 * width_ * static_cast<double>(layer_in(static_cast<int>(k))) * sizes_[k];
  }
  return 2.0 * macs;
}

std::string XdeepfmPart::kernel_report(int64_t batch) const {
  std::ostringstream out;
  out << "\n  cin " << fields() << " fields x " << width_ << ", layers";
  for (int size : sizes_) out << " " << size;
  out << ": sgemm over " << batch * width_ << " rows + parallel_for outer products (fp32)";
  return out.str();
}

void XdeepfmPart::reserve(int64_t batch) {
  const auto n = static_cast<std::size_t>(batch);
  const auto rows = n * static_cast<std::size_t>(width_);
  std::size_t widest_z = 0, widest_h = 0;
  for (std::size_t k = 0; k < sizes_.size(); ++k) {
    xs_[k].resize_discard(rows * static_cast<std::size_t>(sizes_[k]));
    widest_z = std::max<std::size_t>(widest_z, layer_in(static_cast<int>(k)));
    widest_h = std::max<std::size_t>(widest_h, static_cast<std::size_t>(sizes_[k]));
  }
  x0_.resize_discard(n * static_cast<std::size_t>(dnn_ld_));
  dx0_.resize_discard(n * static_cast<std::size_t>(dnn_ld_));
  z_.resize_discard(rows * widest_z);
  pooled_.resize_discard(n * static_cast<std::size_t>(pooled_cols()));
  d_pooled_cin_.resize_discard(n * static_cast<std::size_t>(pooled_cols()));
  g_a_.resize_discard(rows * widest_h);
  g_b_.resize_discard(rows * widest_h);
}

}  // namespace gpubox::trainer
