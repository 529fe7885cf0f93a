// AutointPart (autoint_part.hpp): its blocks and buffers; the kernels are in autoint.cu (the
// layers' functors in detail/autoint_layer_kernels.cuh).
#include "trainer/nn/autoint_part.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "common/error.hpp"
#include "trainer/nn/activation_layout.hpp"

namespace gpubox::trainer {
AutointPart::AutointPart(device::Card& card, DenseParameters& params, const SlotSumPool& pool,
                         const DenseModelConfig& config)
    : slots_(pool.slots()),
      dense_dim_(config.dense_dim),
      width_(pool.mf_dim()),
      use_cvm_(pool.use_cvm()),
      slot_width_(pool.width()),
      embedx_column_(pool.embed_w_column() + 1),
      sizes_(config.attn_layer_sizes),
      heads_(config.attn_heads),
      residual_(config.attn_residual),
      scaling_(config.attn_scaling),
      card_(&card) {
  GPUBOX_EXPECTS(pool.uniform(),
                 "autoint's attention multiplies the fields' embeddings with one projection, so "
                 "every slot must be as wide as sparse_feature_dim, but hyper_parameters.slot_dims "
                 "gives the slots different widths; remove slot_dims, or train dnn or wide_deep");
  GPUBOX_EXPECTS(width_ >= 1,
                 "autoint: hyper_parameters.sparse_feature_dim must be 2 or more (embed_w and an "
                 "embedding of at least one value; PaddleRec's embedding_dim is one less)");
  GPUBOX_EXPECTS(!sizes_.empty(),
                 "autoint: hyper_parameters.attn_layer_sizes is empty (it needs a layer)");
  GPUBOX_EXPECTS(heads_ > 0, "autoint: hyper_parameters.head_num must be >= 1, got ", heads_);
  for (int size : sizes_) {
    GPUBOX_EXPECTS(size > 0 && size % heads_ == 0,
                   "autoint: hyper_parameters.attn_layer_sizes has ", size, ", which head_num ",
                   heads_, " does not divide (each head takes ",
                   "attn_layer_size / head_num columns)");
  }
  dnn_ld_ = activation_ld(dnn_in());
  for (std::size_t l = 0; l < sizes_.size(); ++l) {
    const std::string name = "autoint_" + std::to_string(l);
    const int in = in_cols(l), out = sizes_[l];
    // PaddleRec's XavierUniform; here its variance as a normal, 2 / (in + out).
    w_.push_back(params.add(name + ".w",
                            static_cast<std::size_t>(in) * static_cast<std::size_t>(proj_cols(l)),
                            ParamInit::kNormal, std::sqrt(2.0f / static_cast<float>(in + out))));
    gamma_.push_back(
        params.add(name + ".ln_gamma", static_cast<std::size_t>(out), ParamInit::kOne));
    beta_.push_back(params.add(name + ".ln_beta", static_cast<std::size_t>(out), ParamInit::kZero));
  }
  const int flat = fields() * sizes_.back();
  // PaddleRec's output Linear: N(0, 2 / (F A_L + 1)).
  w_out_ = params.add("autoint_out.w", static_cast<std::size_t>(flat), ParamInit::kNormal,
                      std::sqrt(2.0f / static_cast<float>(flat + 1)));
  if (dense_dim_ > 0) {
    // PaddleRec's embedding rows: N(0, 0.01^2).
    dense_w_ = params.add("autoint.dense_w", static_cast<std::size_t>(dense_dim_) * width_,
                          ParamInit::kNormal, 0.01f);
  }
  for (auto* list : {&proj_, &att_, &y_, &stats_, &out_}) {
    list->resize(sizes_.size());
    for (auto& buffer : *list) buffer = card.make_buffer<float>(0);
  }
  for (auto* buffer :
       {&x0_, &dnn_x_, &dnn_dx_, &d_proj_, &d_o_, &d_s_, &g_a_, &g_b_, &dx0_, &ones_}) {
    *buffer = card.make_buffer<float>(0);
  }
  dense_pairs_ =
      card.make_buffer<float>(static_cast<std::size_t>(dense_dim_) * dense_dim_ * width_);
}

double AutointPart::flops_per_example() const {
  double macs = 0.0;
  const double f = fields();
  for (std::size_t l = 0; l < sizes_.size(); ++l) {
    // projections: forward H W, weight gradient H^T G, input gradient G W^T (F rows each).
    macs += 3.0 * f * in_cols(l) * proj_cols(l);
    // attention: scores Q K^T and P V forward (F x F x A each); backward dP, dV, dQ, dK.
    macs += 6.0 * f * f * sizes_[l];
  }
  return 2.0 * macs;
}

std::string AutointPart::kernel_report(int64_t batch) const {
  std::ostringstream out;
  out << "\n  autoint " << fields() << " fields x " << width_ << ", " << heads_ << " heads, layers";
  for (int size : sizes_) out << " " << size;
  out << ": sgemm over " << batch * fields() << " rows + batched sgemm attention per head (fp32)";
  return out.str();
}

void AutointPart::reserve(int64_t batch) {
  const auto n = static_cast<std::size_t>(batch);
  const auto rows = n * static_cast<std::size_t>(fields());
  const auto f = static_cast<std::size_t>(fields());
  std::size_t widest_proj = 0, widest_h = static_cast<std::size_t>(width_);
  for (std::size_t l = 0; l < sizes_.size(); ++l) {
    const auto a = static_cast<std::size_t>(sizes_[l]);
    proj_[l].resize_discard(rows * static_cast<std::size_t>(proj_cols(l)));
    att_[l].resize_discard(n * static_cast<std::size_t>(heads_) * f * f);
    y_[l].resize_discard(rows * a);
    stats_[l].resize_discard(rows * 2);
    out_[l].resize_discard(rows * a);
    widest_proj = std::max<std::size_t>(widest_proj, static_cast<std::size_t>(proj_cols(l)));
    widest_h = std::max(widest_h, a);
  }
  x0_.resize_discard(rows * static_cast<std::size_t>(width_));
  dx0_.resize_discard(rows * static_cast<std::size_t>(width_));
  dnn_x_.resize_discard(n * static_cast<std::size_t>(dnn_ld_));
  dnn_dx_.resize_discard(n * static_cast<std::size_t>(dnn_ld_));
  d_proj_.resize_discard(rows * widest_proj);
  d_o_.resize_discard(rows * widest_h);
  d_s_.resize_discard(n * static_cast<std::size_t>(heads_) * f * f);
  g_a_.resize_discard(rows * widest_h);
  g_b_.resize_discard(rows * widest_h);
  if (ones_.size() < rows) {
    ones_ = device::to_device(std::vector<float>(rows, 1.0f), card_->memory(), card_->stream());
  }
}

}  // namespace gpubox::trainer
