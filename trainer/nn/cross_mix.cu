// dcn_v2's DCN-Mix cross layers, CrossKind::kMixture (CrossNet, layers.hpp). Per layer l, with
// E experts of rank r side by side (V_l [D x Er], C_l [E x r x r], U_l [Er x D]):
//   a = tanh(x_l V_l)                     [B x Er]
//   h_e = tanh(a_e C_le)                   [B x r] each, together [B x Er]
//   p = softmax(x_l G + g)                 [B x E]  (one gate for every layer)
//   m_e = p_e h_e;  pre = m U_l + b_l;  x_{l+1} = x0 * pre + x_l
// Backward from g = dL/dx_{l+1}: dpre = g * x0, dm = dpre U_l^T, dp_e = h_e . dm_e, the
// softmax's dz_e = p_e (dp_e - sum_f p_f dp_f), dh_e = p_e dm_e, then back through the tanhs,
// C, V and the gate's G to dL/dx_l. Portable: GEMMs through the card's Blas (fp32, or bf16
// operands: CrossNet::gemm), the rest parallel_for.
#include <cmath>
#include <string>

#include "heterps/device/parallel_for.cuh"
#include "trainer/nn/detail/cross_functors.cuh"
#include "trainer/nn/layers.hpp"

namespace gpubox::trainer {
namespace {
using detail::entries;
using detail::Entry;

// x[k] = tanh(x[k]).
struct TanhInPlace {
  float* x;
  GPUBOX_HD void operator()(std::size_t k) const { x[k] = detail::tanh_f(x[k]); }
};

// d[k] *= 1 - a[k]^2, a = tanh(.): the gradient through the tanh.
struct TanhGrad {
  const float* a;
  float* d;
  GPUBOX_HD void operator()(std::size_t k) const { d[k] *= 1.0f - a[k] * a[k]; }
};

// Row i of p [B x E]: the gate logits (x_l G) plus the bias, to their softmax (max subtracted).
struct GateSoftmax {
  float* p;
  const float* bias;
  int experts;
  GPUBOX_HD void operator()(std::size_t i) const {
    float* row = p + static_cast<int64_t>(i) * experts;
    float top = row[0] + bias[0];
    for (int e = 1; e < experts; ++e) top = row[e] + bias[e] > top ? row[e] + bias[e] : top;
    float sum = 0.0f;
    for (int e = 0; e < experts; ++e) {
      row[e] = detail::exp_f(row[e] + bias[e] - top);
      sum += row[e];
    }
    for (int e = 0; e < experts; ++e) row[e] /= sum;
  }
};

// m[i, c] = p[i, c / r] * h[i, c] over [B x Er]: each expert's output weighed by its gate.
struct ScaleByGate {
  const float* p;
  const float* h;
  float* m;
  int rank;
  int cols;  // E * r
  GPUBOX_HD void operator()(std::size_t flat) const {
    const Entry e = detail::entry(flat, cols);
    const int experts = cols / rank;
    m[flat] = p[e.i * experts + e.j / rank] * h[flat];
  }
};

// Row i: dz[i, e] = p_e (dp_e - sum_f p_f dp_f), dp_e = h[i, expert e] . dm[i, expert e].
struct GateGrad {
  const float* p;
  const float* h;
  const float* dm;
  float* dz;
  int experts;
  int rank;
  GPUBOX_HD void operator()(std::size_t i) const {
    const int64_t cols = static_cast<int64_t>(experts) * rank;
    const float* hr = h + static_cast<int64_t>(i) * cols;
    const float* dmr = dm + static_cast<int64_t>(i) * cols;
    const float* pr = p + static_cast<int64_t>(i) * experts;
    float* dzr = dz + static_cast<int64_t>(i) * experts;
    float mean = 0.0f;
    for (int e = 0; e < experts; ++e) {
      float dp = 0.0f;
      for (int k = 0; k < rank; ++k) dp += hr[e * rank + k] * dmr[e * rank + k];
      dzr[e] = dp;
      mean += pr[e] * dp;
    }
    for (int e = 0; e < experts; ++e) dzr[e] = pr[e] * (dzr[e] - mean);
  }
};

// dm[i, c] = p[i, c / r] * dm[i, c] * (1 - h[i, c]^2): from dL/dm to dL/d(a_e C_le).
struct GatedTanhGrad {
  const float* p;
  const float* h;
  float* dm;
  int rank;
  int cols;
  GPUBOX_HD void operator()(std::size_t flat) const {
    const Entry e = detail::entry(flat, cols);
    const int experts = cols / rank;
    dm[flat] *= p[e.i * experts + e.j / rank] * (1.0f - h[flat] * h[flat]);
  }
};
}  // namespace

void CrossNet::add_mixture_blocks(DenseParameters& params, int l) {
  const std::string name = "cross_" + std::to_string(l);
  const auto d = static_cast<std::size_t>(dim_);
  const auto r = static_cast<std::size_t>(rank_);
  const auto e = static_cast<std::size_t>(experts_);
  const float normal_r = 1.0f / std::sqrt(static_cast<float>(rank_));
  w_.push_back(params.add(name + ".v", d * e * r, ParamInit::kNormal,
                          1.0f / std::sqrt(static_cast<float>(dim_))));
  c_.push_back(params.add(name + ".c", e * r * r, ParamInit::kNormal, normal_r));
  u_.push_back(params.add(name + ".u", e * r * d, ParamInit::kNormal, normal_r));
}

void CrossNet::forward_mixture(const Blas& blas, const DenseParameters& params, const float* x0,
                               int64_t batch, int l) {
  const device::Stream& stream = blas.stream();
  const auto at = static_cast<std::size_t>(l);
  const float* in = layer_input(x0, l);
  const int er = experts_ * rank_;
  constexpr Transpose kNo = Transpose::kNo;
  const Operand x = rounded(stream, in, batch, dim_, ld_, copy_of(in_bf16_, at));
  float* a = low_[at].data();
  float* h = act_[at].data();
  float* p = gate_[at].data();
  gemm(blas, kNo, kNo, batch, er, dim_, x, weight(params, w_[at], er), 0.0f, a, er);
  device::parallel_for(stream, entries(batch, er), TanhInPlace{a});
  const Operand as = rounded(stream, a, batch, er, er, copy_of(low_bf16_, at));
  const Operand c = weight(params, c_[at], rank_);
  for (int e = 0; e < experts_; ++e) {
    gemm(blas, kNo, kNo, batch, rank_, rank_, as.at(e * rank_),
         c.at(static_cast<int64_t>(e) * rank_ * rank_), 0.0f, h + e * rank_, er);
  }
  device::parallel_for(stream, entries(batch, er), TanhInPlace{h});
  gemm(blas, kNo, kNo, batch, experts_, dim_, x, weight(params, gate_w_, experts_), 0.0f, p,
       experts_);
  device::parallel_for(stream, static_cast<std::size_t>(batch),
                       GateSoftmax{p, params.values(gate_b_), experts_});
  float* m = mix_[at].data();
  device::parallel_for(stream, entries(batch, er), ScaleByGate{p, h, m, rank_, er});
  const Operand ms = rounded(stream, m, batch, er, er, copy_of(mix_bf16_, at));
  float* pre = pre_[at].data();
  gemm(blas, kNo, kNo, batch, dim_, er, ms, weight(params, u_[at], dim_), 0.0f, pre, ld_);
  device::parallel_for(
      stream, entries(batch, dim_),
      detail::CrossCombine{x0, in, params.values(b_[at]), pre, xs_[at].data(), ld_, dim_});
}

void CrossNet::backward_mixture(const Blas& blas, DenseParameters& params, const float* x0,
                                int64_t batch, int l) {
  const device::Stream& stream = blas.stream();
  const auto at = static_cast<std::size_t>(l);
  const float* in = layer_input(x0, l);
  const int er = experts_ * rank_;
  device::parallel_for(stream, entries(batch, dim_),
                       detail::CrossBackwardProduct{g_.data(), x0, pre_[at].data(), dpre_.data(),
                                                    dx0_.data(), ld_, dim_, l == layers_ - 1});
  device::parallel_for(stream, static_cast<std::size_t>(dim_),
                       detail::ColumnSum{dpre_.data(), params.grads(b_[at]), batch, ld_});
  constexpr Transpose kNo = Transpose::kNo, kYes = Transpose::kYes;
  const Operand x = stored(in, copy_of(in_bf16_, at), ld_);
  const Operand dpre = rounded(stream, dpre_.data(), batch, dim_, ld_, dpre_bf16_.data());
  gemm(blas, kYes, kNo, er, dim_, batch, stored(mix_[at].data(), copy_of(mix_bf16_, at), er), dpre,
       0.0f, params.grads(u_[at]), dim_);
  gemm(blas, kNo, kYes, batch, er, dim_, dpre, weight(params, u_[at], dim_), 0.0f, dlow_.data(),
       er);
  backward_mixture_gate(blas, params, x, batch, l);  // dlow_: dL/d(a_e C_le) from here
  const float* a = low_[at].data();
  const Operand as = stored(a, copy_of(low_bf16_, at), er);
  const Operand dlow = rounded(stream, dlow_.data(), batch, er, er, dlow_bf16_.data());
  const Operand c = weight(params, c_[at], rank_);
  float* dc = params.grads(c_[at]);
  for (int e = 0; e < experts_; ++e) {
    const int64_t block = static_cast<int64_t>(e) * rank_ * rank_;
    gemm(blas, kYes, kNo, rank_, rank_, batch, as.at(e * rank_), dlow.at(e * rank_), 0.0f,
         dc + block, rank_);
    gemm(blas, kNo, kYes, batch, rank_, rank_, dlow.at(e * rank_), c.at(block), 0.0f,
         dlow2_.data() + e * rank_, er);
  }
  device::parallel_for(stream, entries(batch, er), TanhGrad{a, dlow2_.data()});
  const Operand dlow2 = rounded(stream, dlow2_.data(), batch, er, er, dlow2_bf16_.data());
  gemm(blas, kYes, kNo, dim_, er, batch, x, dlow2, 0.0f, params.grads(w_[at]), er);
  // g becomes dL/dx_l: the identity path, the gate's term (backward_mixture_gate) and V's.
  gemm(blas, kNo, kYes, batch, dim_, er, dlow2, weight(params, w_[at], er), 1.0f, g_.data(), ld_);
}

void CrossNet::backward_mixture_gate(const Blas& blas, DenseParameters& params, const Operand& in,
                                     int64_t batch, int l) {
  const device::Stream& stream = blas.stream();
  const auto at = static_cast<std::size_t>(l);
  const int er = experts_ * rank_;
  const float* p = gate_[at].data();
  const float* h = act_[at].data();
  device::parallel_for(stream, static_cast<std::size_t>(batch),
                       GateGrad{p, h, dlow_.data(), dgate_.data(), experts_, rank_});
  // The gate is every layer's: the top layer (backward's first) writes its gradients, the
  // others add to them.
  const bool first = l == layers_ - 1;
  const Operand dgate =
      rounded(stream, dgate_.data(), batch, experts_, experts_, dgate_bf16_.data());
  gemm(blas, Transpose::kYes, Transpose::kNo, dim_, experts_, batch, in, dgate, first ? 0.0f : 1.0f,
       params.grads(gate_w_), experts_);
  device::parallel_for(
      stream, static_cast<std::size_t>(experts_),
      detail::ColumnSum{dgate_.data(), params.grads(gate_b_), batch, experts_, !first});
  gemm(blas, Transpose::kNo, Transpose::kYes, batch, dim_, experts_, dgate,
       weight(params, gate_w_, experts_), 1.0f, g_.data(), ld_);
  device::parallel_for(stream, entries(batch, er), GatedTanhGrad{p, h, dlow_.data(), rank_, er});
}

}  // namespace gpubox::trainer
