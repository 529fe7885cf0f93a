// The cross networks (CrossNet, layers.hpp): construction, the layer loop, the parallel logit,
// the pooled gradient and dcn_v2's plain (kMatrix) layers; kVector's layers are cross_vector.cu's,
// kMixture's cross_mix.cu's. Portable: the GEMMs through the card's Blas (fp32, or bf16 operands:
// CrossNet::gemm), the elementwise work as parallel_for functors (detail/cross_functors.cuh).
#include <cmath>
#include <sstream>
#include <string>

#include "common/error.hpp"
#include "heterps/device/isa_clones.cuh"
#include "heterps/device/parallel_for.cuh"
#include "trainer/nn/detail/cross_functors.cuh"
#include "trainer/nn/layers.hpp"

namespace gpubox::trainer {
namespace {
using detail::ColumnSum;
using detail::CrossBackwardProduct;
using detail::CrossCombine;
using detail::entries;
using detail::PooledGrad;

// Columns of the per-layer low buffers (layers.hpp: low_).
int64_t low_cols(CrossKind kind, int rank, int experts) {
  switch (kind) {
    case CrossKind::kVector:
      return 1;
    case CrossKind::kMixture:
      return static_cast<int64_t>(experts) * rank;
    case CrossKind::kMatrix:
      break;
  }
  return rank;
}

const char* cross_kind_text(CrossKind kind) {
  switch (kind) {
    case CrossKind::kVector:
      return "vector";
    case CrossKind::kMixture:
      return "mixture";
    case CrossKind::kMatrix:
      break;
  }
  return "matrix";
}
}  // namespace

CrossNet::CrossNet(device::Card& card, DenseParameters& params, int dim, int64_t ld, int layers,
                   int rank, bool parallel)
    : CrossNet(card, params, CrossSpec{dim, ld, layers, CrossKind::kMatrix, rank, 0, parallel}) {}

CrossNet::CrossNet(device::Card& card, DenseParameters& params, const CrossSpec& spec)
    : dim_(spec.dim),
      ld_(spec.ld),
      layers_(spec.layers),
      rank_(spec.rank),
      kind_(spec.kind),
      experts_(spec.kind == CrossKind::kMixture ? spec.experts : 0),
      parallel_(spec.parallel),
      bf16_(spec.bf16 && spec.kind != CrossKind::kVector) {
  GPUBOX_EXPECTS(dim_ > 0 && ld_ >= dim_, "cross network: dim ", dim_, " with row stride ", ld_);
  GPUBOX_EXPECTS(layers_ >= 1, "hyper_parameters.cross_layers must be >= 1, got ", layers_);
  GPUBOX_EXPECTS(rank_ >= 0, "hyper_parameters.cross_rank must be >= 0, got ", rank_);
  GPUBOX_EXPECTS(kind_ != CrossKind::kMixture || (rank_ > 0 && experts_ >= 1),
                 "DCN-Mix needs hyper_parameters.cross_rank > 0 and cross_experts >= 1, got rank ",
                 rank_, " and ", spec.experts, " experts");
  const auto d = static_cast<std::size_t>(dim_);
  const auto r = static_cast<std::size_t>(rank_);
  const float normal_d = 1.0f / std::sqrt(static_cast<float>(dim_));
  for (int l = 0; l < layers_; ++l) {
    const std::string name = "cross_" + std::to_string(l);
    if (kind_ == CrossKind::kVector) {
      add_vector_blocks(params, l);
    } else if (kind_ == CrossKind::kMixture) {
      add_mixture_blocks(params, l);
    } else if (rank_ == 0) {
      w_.push_back(params.add(name + ".w", d * d, ParamInit::kNormal, normal_d));
    } else {
      w_.push_back(params.add(name + ".v", d * r, ParamInit::kNormal, normal_d));
      u_.push_back(params.add(name + ".u", r * d, ParamInit::kNormal,
                              1.0f / std::sqrt(static_cast<float>(rank_))));
    }
    b_.push_back(params.add(name + ".b", d, ParamInit::kZero));
  }
  if (kind_ == CrossKind::kMixture) {
    const auto e = static_cast<std::size_t>(experts_);
    gate_w_ = params.add("cross_gate.w", d * e, ParamInit::kNormal, normal_d);
    gate_b_ = params.add("cross_gate.b", e, ParamInit::kZero);
  }
  if (parallel_) w_out_ = params.add("cross_out.w", d, ParamInit::kNormal, normal_d);
  const bool mixture = kind_ == CrossKind::kMixture;
  for (int l = 0; l < layers_; ++l) {
    xs_.push_back(card.make_buffer<float>(0));
    if (kind_ != CrossKind::kVector) pre_.push_back(card.make_buffer<float>(0));
    if (kind_ != CrossKind::kMatrix || rank_ > 0) low_.push_back(card.make_buffer<float>(0));
    if (mixture) {
      for (auto* list : {&act_, &gate_, &mix_}) list->push_back(card.make_buffer<float>(0));
    }
  }
  for (auto* buffer : {&g_, &dpre_, &dx0_, &dlow_, &dlow2_, &dgate_}) {
    *buffer = card.make_buffer<float>(0);
  }
  if (!bf16_) return;
  for (int l = 0; l < layers_; ++l) {
    in_bf16_.push_back(card.make_buffer<Bf16>(0));
    if (!low_.empty()) low_bf16_.push_back(card.make_buffer<Bf16>(0));
    if (mixture) mix_bf16_.push_back(card.make_buffer<Bf16>(0));
  }
  for (auto* buffer : {&dpre_bf16_, &dlow_bf16_, &dlow2_bf16_, &dgate_bf16_}) {
    *buffer = card.make_buffer<Bf16>(0);
  }
}

std::string CrossNet::describe(int64_t batch, bool emulated) const {
  std::ostringstream out;
  out << layers_ << " x " << dim_ << "x" << dim_ << " " << cross_kind_text(kind_)
      << (rank_ > 0 ? " rank " + std::to_string(rank_) : std::string())
      << (experts_ > 0 ? " experts " + std::to_string(experts_) : std::string())
      << (parallel_ ? ", parallel" : ", stacked")
      << (bf16_ ? ": gemm_bf16 (bf16 operands, fp32 accumulation" : ": sgemm (fp32")
      << (bf16_ && emulated ? ", emulated in fp32: GPUBOX_BF16_EMULATION=1" : "")
      << ") + elementwise (fp32, batch " << batch << ")";
  return out.str();
}

double CrossNet::flops_per_example() const {
  // Per layer: the forward GEMM(s), the weight gradient(s) and the input gradient(s).
  const double d = dim_;
  double per_gemm = rank_ == 0 ? d * d : 2.0 * d * rank_;
  if (kind_ == CrossKind::kVector) per_gemm = d;
  if (kind_ == CrossKind::kMixture) {
    const double er = static_cast<double>(experts_) * rank_;
    per_gemm = 2.0 * d * er + er * rank_ + d * experts_;
  }
  return 2.0 * layers_ * 3.0 * per_gemm + (parallel_ ? 2.0 * 2.0 * d : 0.0);
}

void CrossNet::reserve(int64_t batch) {
  GPUBOX_EXPECTS(batch >= 0, "negative batch ", batch);
  const auto rows = static_cast<std::size_t>(batch);
  const std::size_t matrix = rows * static_cast<std::size_t>(ld_);
  const std::size_t low = rows * static_cast<std::size_t>(low_cols(kind_, rank_, experts_));
  const std::size_t gates = rows * static_cast<std::size_t>(experts_);
  for (auto& buffer : xs_) buffer.resize_discard(matrix);
  for (auto& buffer : pre_) buffer.resize_discard(matrix);
  for (auto& buffer : low_) buffer.resize_discard(low);
  for (auto& buffer : act_) buffer.resize_discard(low);
  for (auto& buffer : mix_) buffer.resize_discard(low);
  for (auto& buffer : gate_) buffer.resize_discard(gates);
  for (auto* buffer : {&g_, &dpre_, &dx0_}) buffer->resize_discard(matrix);
  dlow_.resize_discard(low);
  if (kind_ == CrossKind::kMixture) dlow2_.resize_discard(low);
  dgate_.resize_discard(gates);
  if (!bf16_) return;
  for (auto& buffer : in_bf16_) buffer.resize_discard(matrix);
  for (auto& buffer : low_bf16_) buffer.resize_discard(low);
  for (auto& buffer : mix_bf16_) buffer.resize_discard(low);
  dpre_bf16_.resize_discard(matrix);
  dlow_bf16_.resize_discard(low);
  if (kind_ == CrossKind::kMixture) dlow2_bf16_.resize_discard(low);
  dgate_bf16_.resize_discard(gates);
}

CrossNet::Operand CrossNet::weight(const DenseParameters& params, std::size_t block,
                                   int64_t ld) const {
  if (!bf16_) return {params.values(block), nullptr, ld};
  GPUBOX_EXPECTS(params.has_bf16_copy(),
                 "the cross layers read bf16 weights but the parameters keep no bf16 copy");
  return {params.values(block), params.values_bf16(block), ld};
}

CrossNet::Operand CrossNet::rounded(const device::Stream& stream, const float* rows, int64_t n,
                                    int cols, int64_t ld, Bf16* copy) const {
  if (!bf16_) return {rows, nullptr, ld};
  to_bf16_rows_async(stream, rows, n, cols, ld, copy);
  return {rows, copy, ld};
}

void CrossNet::gemm(const Blas& blas, Transpose ta, Transpose tb, int64_t m, int64_t n, int64_t k,
                    const Operand& a, const Operand& b, float beta, float* c, int64_t ldc) const {
  if (bf16_) {
    blas.gemm_bf16(ta, tb, m, n, k, 1.0f, a.bf16, a.ld, b.bf16, b.ld, beta, c, ldc);
  } else {
    blas.sgemm(ta, tb, m, n, k, 1.0f, a.f32, a.ld, b.f32, b.ld, beta, c, ldc);
  }
}

const float* CrossNet::output() const { return xs_.back().data(); }

void CrossNet::forward(const Blas& blas, const DenseParameters& params, const float* x0,
                       int64_t batch) {
  reserve(batch);
  for (int l = 0; l < layers_; ++l) {
    switch (kind_) {
      case CrossKind::kMatrix:
        forward_matrix(blas, params, x0, batch, l);
        break;
      case CrossKind::kVector:
        forward_vector(blas, params, x0, batch, l);
        break;
      case CrossKind::kMixture:
        forward_mixture(blas, params, x0, batch, l);
        break;
    }
  }
}

void CrossNet::forward_matrix(const Blas& blas, const DenseParameters& params, const float* x0,
                              int64_t batch, int l) {
  const auto at = static_cast<std::size_t>(l);
  const float* in = layer_input(x0, l);
  const Operand x = rounded(blas.stream(), in, batch, dim_, ld_, copy_of(in_bf16_, at));
  float* pre = pre_[at].data();
  constexpr Transpose kNo = Transpose::kNo;
  if (rank_ == 0) {
    gemm(blas, kNo, kNo, batch, dim_, dim_, x, weight(params, w_[at], dim_), 0.0f, pre, ld_);
  } else {
    float* low = low_[at].data();
    gemm(blas, kNo, kNo, batch, rank_, dim_, x, weight(params, w_[at], rank_), 0.0f, low, rank_);
    const Operand lows = rounded(blas.stream(), low, batch, rank_, rank_, copy_of(low_bf16_, at));
    gemm(blas, kNo, kNo, batch, dim_, rank_, lows, weight(params, u_[at], dim_), 0.0f, pre, ld_);
  }
  device::parallel_for(blas.stream(), entries(batch, dim_),
                       device::isa_clones(CrossCombine{x0, in, params.values(b_[at]), pre,
                                                       xs_[at].data(), ld_, dim_}));
}

void CrossNet::add_logits(const Blas& blas, const DenseParameters& params, int64_t batch,
                          float* logits) const {
  GPUBOX_EXPECTS(parallel_, "add_logits is the parallel structure's");
  blas.sgemv(Transpose::kNo, batch, dim_, 1.0f, output(), ld_, params.values(w_out_), 1.0f, logits);
}

void CrossNet::backward_from_logits(const Blas& blas, DenseParameters& params, const float* dlogits,
                                    float scale, int64_t batch) {
  GPUBOX_EXPECTS(parallel_, "backward_from_logits is the parallel structure's");
  blas.sgemv(Transpose::kYes, batch, dim_, scale, output(), ld_, dlogits, 0.0f,
             params.grads(w_out_));
  blas.sgemm(Transpose::kNo, Transpose::kNo, batch, dim_, 1, scale, dlogits, 1,
             params.values(w_out_), dim_, 0.0f, g_.data(), ld_);
}

void CrossNet::backward(const Blas& blas, DenseParameters& params, const float* x0, int64_t batch,
                        float unscale, float* d_pooled, int pooled_cols, int64_t d_ld,
                        bool accumulate) {
  GPUBOX_EXPECTS(pooled_cols >= 0 && pooled_cols <= dim_ && d_ld >= pooled_cols, "pooled columns ",
                 pooled_cols, " of a cross network over ", dim_, " at row stride ", d_ld);
  for (int l = layers_ - 1; l >= 0; --l) {
    switch (kind_) {
      case CrossKind::kMatrix:
        backward_matrix(blas, params, x0, batch, l);
        break;
      case CrossKind::kVector:
        backward_vector(blas, params, x0, batch, l);
        break;
      case CrossKind::kMixture:
        backward_mixture(blas, params, x0, batch, l);
        break;
    }
  }
  device::parallel_for(blas.stream(), entries(batch, pooled_cols),
                       device::isa_clones(PooledGrad{g_.data(), dx0_.data(), d_pooled, ld_, d_ld,
                                                     pooled_cols, unscale, accumulate}));
}

void CrossNet::backward_matrix(const Blas& blas, DenseParameters& params, const float* x0,
                               int64_t batch, int l) {
  const device::Stream& stream = blas.stream();
  const auto at = static_cast<std::size_t>(l);
  const float* in = layer_input(x0, l);
  device::parallel_for(
      stream, entries(batch, dim_),
      device::isa_clones(CrossBackwardProduct{g_.data(), x0, pre_[at].data(), dpre_.data(),
                                              dx0_.data(), ld_, dim_, l == layers_ - 1}));
  device::parallel_for(
      stream, static_cast<std::size_t>(dim_),
      device::isa_clones(ColumnSum{dpre_.data(), params.grads(b_[at]), batch, ld_}));
  // g becomes dL/dx_l: the identity path (g itself) plus dpre through the layer's GEMM(s).
  constexpr Transpose kNo = Transpose::kNo, kYes = Transpose::kYes;
  const Operand x = stored(in, copy_of(in_bf16_, at), ld_);
  const Operand dpre = rounded(stream, dpre_.data(), batch, dim_, ld_, dpre_bf16_.data());
  if (rank_ == 0) {
    const Operand w = weight(params, w_[at], dim_);
    gemm(blas, kYes, kNo, dim_, dim_, batch, x, dpre, 0.0f, params.grads(w_[at]), dim_);
    gemm(blas, kNo, kYes, batch, dim_, dim_, dpre, w, 1.0f, g_.data(), ld_);
  } else {
    const Operand v = weight(params, w_[at], rank_);
    const Operand u = weight(params, u_[at], dim_);
    const Operand low = stored(low_[at].data(), copy_of(low_bf16_, at), rank_);
    gemm(blas, kYes, kNo, rank_, dim_, batch, low, dpre, 0.0f, params.grads(u_[at]), dim_);
    gemm(blas, kNo, kYes, batch, rank_, dim_, dpre, u, 0.0f, dlow_.data(), rank_);
    const Operand dlow = rounded(stream, dlow_.data(), batch, rank_, rank_, dlow_bf16_.data());
    gemm(blas, kYes, kNo, dim_, rank_, batch, x, dlow, 0.0f, params.grads(w_[at]), rank_);
    gemm(blas, kNo, kYes, batch, dim_, rank_, dlow, v, 1.0f, g_.data(), ld_);
  }
}

void CrossNet::add_l2_gradient(const device::Stream& stream, DenseParameters& params,
                               float alpha) const {
  for (const std::vector<std::size_t>* blocks : {&w_, &u_, &c_}) {
    for (const std::size_t block : *blocks) {
      device::parallel_for(stream, params.blocks().at(block).count,
                           detail::AddScaled{params.values(block), params.grads(block), alpha});
    }
  }
}

}  // namespace gpubox::trainer
