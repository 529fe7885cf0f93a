// DlrmPart (dlrm_part.hpp): the bottom MLP's layers and buffers; the interaction's kernels are in
// dot_interaction.cu.
#include "trainer/nn/dlrm_part.hpp"

#include <algorithm>
#include <sstream>
#include <utility>

#include "common/error.hpp"
#include "trainer/nn/activation_layout.hpp"

namespace gpubox::trainer {
DlrmPart::DlrmPart(device::Card& card, DenseParameters& params, Blas& blas, const SlotSumPool& pool,
                   const DenseModelConfig& config, ElementType activation)
    : activation_(activation),
      slots_(pool.slots()),
      slot_width_(pool.width()),
      vector_column_(pool.embed_w_column()),
      width_(1 + pool.mf_dim()),
      use_cvm_(pool.use_cvm()),
      dense_dim_(config.dense_dim) {
  const std::vector<int>& sizes = config.bot_layer_sizes;
  GPUBOX_EXPECTS(!sizes.empty(),
                 "dlrm: hyper_parameters.bot_layer_sizes is empty; its last entry "
                 "is the bottom MLP's output, as wide as hyper_parameters.sparse_feature_dim");
  GPUBOX_EXPECTS(pool.uniform(),
                 "dlrm's dot interaction needs every slot's embedding as wide as the bottom MLP's "
                 "output (the last of hyper_parameters.bot_layer_sizes: ",
                 sizes.back(),
                 "), but hyper_parameters.slot_dims gives the slots different widths; remove "
                 "slot_dims, or train dnn, wide_deep or dcn_v2");
  GPUBOX_EXPECTS(sizes.back() == width_,
                 "dlrm's dot interaction needs the bottom MLP's output (the last of "
                 "hyper_parameters.bot_layer_sizes: ",
                 sizes.back(),
                 ") as wide as every slot's "
                 "embedding (hyper_parameters.sparse_feature_dim: ",
                 width_, ", embed_w and the embedx values); set them equal");
  GPUBOX_EXPECTS(dense_dim_ > 0,
                 "dlrm's bottom MLP reads the dense features, but "
                 "hyper_parameters.dense_input_dim is 0");
  bottom_in_ld_ = activation_ld(dense_dim_);
  top_ld_ = activation_ld(top_in());
  bottom_.reserve(sizes.size());
  int in = dense_dim_;
  for (std::size_t l = 0; l < sizes.size(); ++l) {
    const bool last = l + 1 == sizes.size();
    LinearGemmSpec spec;
    spec.name = "bot_" + std::to_string(l);
    spec.in = in;
    spec.out = sizes[l];
    spec.input = spec.output = spec.dx = activation;
    spec.relu = true;  // the last layer too (PaddleRec's and MLPerf's bottom MLP)
    spec.input_is_relu = l > 0 && !config.batch_norm;
    spec.dx_cols = l == 0 ? 0 : in;  // the dense features need no gradient
    spec.x_ld = l == 0 ? bottom_in_ld_ : activation_ld(in);
    // The last writes R's first columns (with batch norm: its norm does).
    spec.y_ld = last && !config.batch_norm ? top_ld_ : activation_ld(spec.out);
    spec.dz_ld = activation_ld(spec.out);
    spec.dx_ld = l == 0 ? bottom_in_ld_ : activation_ld(in);
    bottom_.emplace_back(params, blas, spec);
    if (config.batch_norm) {
      BatchNormSpec norm;
      norm.name = spec.name + ".bn";
      norm.cols = spec.out;
      norm.x_ld = norm.grad_ld = spec.dz_ld;
      norm.y_ld = last ? top_ld_ : spec.dz_ld;
      norm.type = activation;
      norms_.emplace_back(card, params, norm);
    }
    in = spec.out;
  }
  hidden_.resize(norms_.empty() ? bottom_.size() - 1 : bottom_.size());
  normed_.resize(norms_.empty() ? 0 : bottom_.size() - 1);
  for (auto& buffer : hidden_) buffer = card.make_buffer<char>(0);
  for (auto& buffer : normed_) buffer = card.make_buffer<char>(0);
  for (auto* buffer : {&bottom_in_, &top_in_, &dz_a_, &dz_b_}) *buffer = card.make_buffer<char>(0);
  d_top_in_ = card.make_buffer<float>(0);
  d_bottom_ = card.make_buffer<float>(0);
}

double DlrmPart::flops_per_example() const {
  double macs = 0.0;
  for (const Linear& layer : bottom_) {
    macs += static_cast<double>(layer.out()) * (2.0 * layer.in() + layer.spec().dx_cols);
  }
  // Each pair's product forward, and its share of both vectors' gradients backward.
  macs += 3.0 * pairs() * width_;
  return 2.0 * macs;
}

std::string DlrmPart::kernel_report(int64_t batch) const {
  std::ostringstream out;
  for (std::size_t l = 0; l < bottom_.size(); ++l) {
    const Linear& layer = bottom_[l];
    out << "\n  " << layer.spec().name << " " << layer.in() << "x" << layer.out() << ": "
        << layer.describe(batch);
    if (l < norms_.size()) out << "\n  " << norms_[l].describe();
  }
  out << "\n  dot interaction " << features() << " x " << width_ << ", " << pairs()
      << " pairs: parallel_for (" << element_type_name(activation_) << ", fp32 sums, batch "
      << batch << ")";
  return out.str();
}

void DlrmPart::reserve(int64_t batch) {
  const auto n = static_cast<std::size_t>(batch);
  const std::size_t act = element_bytes(activation_);
  bottom_in_.resize_discard(n * bottom_in_ld_ * act);
  std::size_t widest_dz = 0;
  for (std::size_t l = 0; l < bottom_.size(); ++l) {
    const LinearGemmSpec& spec = bottom_[l].spec();
    if (l < hidden_.size()) hidden_[l].resize_discard(n * spec.y_ld * act);
    if (l < normed_.size()) normed_[l].resize_discard(n * spec.y_ld * act);
    widest_dz = std::max<std::size_t>(widest_dz, spec.dz_ld);
    bottom_[l].prepare(batch);
  }
  dz_a_.resize_discard(n * widest_dz * act);
  dz_b_.resize_discard(n * widest_dz * act);
  top_in_.resize_discard(n * top_ld_ * act);
  d_top_in_.resize_discard(n * top_ld_);
  d_bottom_.resize_discard(n * width_);
}

void DlrmPart::forward(const device::Stream& stream, const DenseParameters& params,
                       const InputRows& x0, const float* dense, int64_t batch, bool training) {
  write_bottom_input(stream, dense, batch);
  for (std::size_t l = 0; l < bottom_.size(); ++l) {
    void* y = l < hidden_.size() ? hidden_[l].data() : top_in_.data();
    bottom_[l].forward(params, bottom_input(l), y, batch);
    if (norms_.empty()) continue;
    void* normed = l < normed_.size() ? normed_[l].data() : top_in_.data();
    if (training) {
      norms_[l].forward_train(stream, params, y, normed, batch);
    } else {
      norms_[l].forward_infer(stream, params, y, normed, batch);
    }
  }
  interaction_forward(stream, x0, batch);
}

void DlrmPart::backward(const device::Stream& stream, DenseParameters& params, const InputRows& x0,
                        int64_t batch, float scale, float unscale, float* d_pooled) {
  // The last bottom dZ into dz_a_ (with batch norm: the gradient of its norm's output).
  interaction_backward(stream, x0, batch, unscale, d_pooled);
  void* dz = dz_a_.data();
  void* spare = dz_b_.data();
  const float share = static_cast<float>(batch) * scale;
  if (!norms_.empty()) {
    norms_.back().backward(stream, params, hidden_.back().data(), dz, spare, batch, share);
    std::swap(dz, spare);
  }
  for (std::size_t l = bottom_.size(); l-- > 0;) {
    const void* x = bottom_input(l);
    bottom_[l].backward_weights(params, x, dz, batch);
    if (l == 0) break;
    if (norms_.empty()) {
      bottom_[l].backward_data(params, dz, x, &bottom_[l - 1], 1.0f, spare, batch);
      std::swap(dz, spare);
    } else {
      // dZ through the layer to its input, the norm's output; the norm takes it to the previous
      // layer's dZ (the ReLU folded in).
      bottom_[l].backward_data(params, dz, x, nullptr, 1.0f, spare, batch);
      norms_[l - 1].backward(stream, params, hidden_[l - 1].data(), spare, dz, batch, share);
    }
  }
}

}  // namespace gpubox::trainer
