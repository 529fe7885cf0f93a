// flen's field-wise bi-interaction (FlenPart, flen_part.hpp). Portable: parallel_for over
// (instance, column) or (instance, pair) items, sgemm/sgemv for the k x k layer and every sum over
// the batch.
#include <cmath>
#include <sstream>
#include <type_traits>
#include <vector>

#include "common/error.hpp"
#include "heterps/device/memory.hpp"
#include "heterps/device/parallel_for.cuh"
#include "trainer/nn/bf16.hpp"
#include "trainer/nn/flen_part.hpp"

namespace gpubox::trainer {
namespace {

struct FlenShape {
  int groups;
  int k;
  int slot_width;
  int embed_column;
  int starts[kFlenMaxGroups + 1];  // group j: slots [starts[j], starts[j + 1])
};

FlenShape make_shape(int groups, int k, int slot_width, int embed_column, const int* starts) {
  FlenShape shape{groups, k, slot_width, embed_column, {}};
  for (int j = 0; j <= groups; ++j) shape.starts[j] = starts[j];
  return shape;
}

// The pair after (a, b) in itertools.combinations order.
GPUBOX_HD inline void next_pair(int groups, int* a, int* b) {
  if (++*b == groups) {
    ++*a;
    *b = *a + 1;
  }
}

// Item (i, c): column c of instance i's group sums g_j and of h = sum_p r_p g_a * g_b.
template <class T>
struct FlenGroups {
  const T* rows;
  int64_t ld;
  const float* kernel_mf;
  float* g;
  float* h;
  FlenShape s;
  GPUBOX_HD void operator()(std::size_t item) const {
    const int k = s.k;
    const auto i = static_cast<int64_t>(item / static_cast<std::size_t>(k));
    const int c = static_cast<int>(item % static_cast<std::size_t>(k));
    const T* row = rows + i * ld + s.embed_column + c;
    float* gi = g + i * s.groups * k + c;
    for (int j = 0; j < s.groups; ++j) {
      float sum = 0.0f;
      for (int slot = s.starts[j]; slot < s.starts[j + 1]; ++slot) {
        sum += to_float(row[slot * s.slot_width]);
      }
      gi[j * k] = sum;
    }
    float hc = 0.0f;
    int a = 0;
    int b = 1;
    for (int p = 0; a < s.groups - 1; ++p, next_pair(s.groups, &a, &b)) {
      hc += kernel_mf[p] * gi[a * k] * gi[b * k];
    }
    h[item] = hc;
  }
};

// Item (i, o): act = relu(u + fc_b), in place over u = h W ([B x k]).
struct FlenBiasRelu {
  const float* fc_b;
  float* act;
  int k;
  GPUBOX_HD void operator()(std::size_t item) const {
    const float u = act[item] + fc_b[item % static_cast<std::size_t>(k)];
    act[item] = u > 0.0f ? u : 0.0f;
  }
};

// Item (i, o): du = dL/du (unscaled) = dlogits[i] out_w[o] scale where act > 0 (act: the ReLU's
// output, dropped: kept units scaled by `scale`, the mask's, 1 without dropout).
struct FlenOutputGrad {
  const float* dlogits;
  const float* out_w;
  const float* act;
  float* du;
  int k;
  float scale;
  GPUBOX_HD void operator()(std::size_t item) const {
    const std::size_t i = item / static_cast<std::size_t>(k);
    du[item] =
        act[item] > 0.0f ? dlogits[i] * out_w[item % static_cast<std::size_t>(k)] * scale : 0.0f;
  }
};

// Item (i, c): dL/d e_s = dL/d g_j for s in group j, column c, added to d_pooled.
struct FlenRowsBackward {
  const float* kernel_mf;
  const float* g;
  const float* dh;
  float* d_pooled;
  int64_t d_ld;
  FlenShape s;
  GPUBOX_HD void operator()(std::size_t item) const {
    const int k = s.k;
    const auto i = static_cast<int64_t>(item / static_cast<std::size_t>(k));
    const int c = static_cast<int>(item % static_cast<std::size_t>(k));
    const float* gi = g + i * s.groups * k + c;
    float* d_row = d_pooled + i * d_ld + s.embed_column + c;
    for (int j = 0; j < s.groups; ++j) {
      // d h / d g_j = r_p g_other for every pair p holding j.
      float dg = 0.0f;
      int a = 0;
      int b = 1;
      for (int p = 0; a < s.groups - 1; ++p, next_pair(s.groups, &a, &b)) {
        if (a == j) dg += kernel_mf[p] * gi[b * k];
        if (b == j) dg += kernel_mf[p] * gi[a * k];
      }
      dg *= dh[item];
      for (int slot = s.starts[j]; slot < s.starts[j + 1]; ++slot) d_row[slot * s.slot_width] += dg;
    }
  }
};

// Item (i, p): q[i, p] = sum_c dh[i, c] g_a[c] g_b[c] (pair p = (a, b)); kernel_mf's gradient is
// its column sums.
struct FlenPairGrad {
  const float* g;
  const float* dh;
  float* q;
  int pairs;
  FlenShape s;
  GPUBOX_HD void operator()(std::size_t item) const {
    const int k = s.k;
    const auto i = static_cast<int64_t>(item / static_cast<std::size_t>(pairs));
    const int pair = static_cast<int>(item % static_cast<std::size_t>(pairs));
    int a = 0;
    int b = 1;
    for (int p = 0; p < pair; ++p) next_pair(s.groups, &a, &b);
    const float* ga = g + (i * s.groups + a) * k;
    const float* gb = g + (i * s.groups + b) * k;
    const float* dhi = dh + i * k;
    float sum = 0.0f;
    for (int c = 0; c < k; ++c) sum += dhi[c] * ga[c] * gb[c];
    q[item] = sum;
  }
};

template <class Launch>
void with_row_type(const InputRows& input, Launch launch) {
  if (input.type == ElementType::kBf16) {
    launch(static_cast<const Bf16*>(input.data));
  } else {
    launch(static_cast<const float*>(input.data));
  }
}

}  // namespace

FlenPart::FlenPart(device::Card& card, DenseParameters& params, const SlotSumPool& pool,
                   const std::vector<int>& group_sizes)
    : card_(&card),
      slots_(pool.slots()),
      groups_(static_cast<int>(group_sizes.size())),
      k_(1 + pool.mf_dim()),
      slot_width_(pool.width()),
      embed_column_(pool.embed_w_column()) {
  GPUBOX_EXPECTS(pool.uniform(),
                 "flen sums its fields' embeddings by group, so every slot must be as wide as "
                 "sparse_feature_dim, but hyper_parameters.slot_dims gives the slots different "
                 "widths; remove slot_dims");
  GPUBOX_EXPECTS(groups_ >= 2 && groups_ <= kFlenMaxGroups,
                 "flen pairs its field groups: hyper_parameters.field_group_sizes needs 2 to ",
                 kFlenMaxGroups, " groups, got ", groups_);
  int start = 0;
  for (int j = 0; j < groups_; ++j) {
    GPUBOX_EXPECTS(group_sizes[j] >= 1, "flen: hyper_parameters.field_group_sizes[", j, "] is ",
                   group_sizes[j], ", a group needs a slot");
    starts_[j] = start;
    start += group_sizes[j];
  }
  starts_[groups_] = start;
  GPUBOX_EXPECTS(start == slots_, "flen: hyper_parameters.field_group_sizes groups ", start,
                 " slots, but the data has ", slots_, " sparse slots");
  // PaddleRec's XavierUniform, as a normal of the same variance: 2 / (fan_in + fan_out).
  kernel_mf_ = params.add("flen.kernel_mf", static_cast<std::size_t>(pairs()), ParamInit::kNormal,
                          std::sqrt(2.0f / static_cast<float>(pairs() + 1)));
  fc_w_ = params.add("flen.fc_w", static_cast<std::size_t>(k_) * k_, ParamInit::kNormal,
                     std::sqrt(1.0f / static_cast<float>(k_)));
  fc_b_ = params.add("flen.fc_b", static_cast<std::size_t>(k_), ParamInit::kZero);
  // PaddleRec's last Linear reads [bi-interaction (k) | DNN (its last layer)]: fan_in 2k.
  out_w_ = params.add("flen.out_w", static_cast<std::size_t>(k_), ParamInit::kNormal,
                      std::sqrt(2.0f / static_cast<float>(2 * k_ + 1)));
  for (auto* buffer : {&g_, &h_, &a_, &du_, &dh_, &q_, &ones_}) {
    *buffer = card.make_buffer<float>(0);
  }
}

double FlenPart::flops_per_example() const {
  // group sums S k; h: 2 P k; fc: k^2 (forward), 2 k^2 backward (dh and dW); pair gradients
  // about 4 P k per group.
  const double k = k_;
  return 2.0 * (slots_ * k + 2.0 * pairs() * k + 3.0 * k * k + 4.0 * pairs() * k * groups_);
}

std::string FlenPart::kernel_report(int64_t batch) const {
  std::ostringstream out;
  out << "\n  flen bi-interaction " << groups_ << " field groups x " << k_ << ", " << pairs()
      << " group pairs: parallel_for over (instance, column); " << k_ << " x " << k_
      << " fc, its gradients and the batch sums: sgemm/sgemv (fp32, batch " << batch << ")";
  return out.str();
}

void FlenPart::reserve(int64_t batch) {
  const auto n = static_cast<std::size_t>(batch) * static_cast<std::size_t>(k_);
  g_.resize_discard(n * static_cast<std::size_t>(groups_));
  for (auto* buffer : {&h_, &a_, &du_, &dh_}) buffer->resize_discard(n);
  q_.resize_discard(static_cast<std::size_t>(batch) * static_cast<std::size_t>(pairs()));
  if (ones_.size() < static_cast<std::size_t>(batch)) {
    ones_ = device::to_device(std::vector<float>(static_cast<std::size_t>(batch), 1.0f),
                              card_->memory(), card_->stream());
  }
}

void FlenPart::forward(const Blas& blas, const DenseParameters& params, const InputRows& input,
                       int64_t batch, const MlpDropout* dropout, float* logits) {
  const device::Stream& stream = blas.stream();
  const FlenShape shape = make_shape(groups_, k_, slot_width_, embed_column_, starts_);
  with_row_type(input, [&](const auto* rows) {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(rows)>>;
    device::parallel_for(
        stream, static_cast<std::size_t>(batch) * static_cast<std::size_t>(k_),
        FlenGroups<T>{rows, input.ld, params.values(kernel_mf_), g_.data(), h_.data(), shape});
  });
  blas.sgemm(Transpose::kNo, Transpose::kNo, batch, k_, k_, 1.0f, h_.data(), k_,
             params.values(fc_w_), k_, 0.0f, a_.data(), k_);
  device::parallel_for(stream, static_cast<std::size_t>(batch) * static_cast<std::size_t>(k_),
                       FlenBiasRelu{params.values(fc_b_), a_.data(), k_});
  if (dropout != nullptr) dropout->side_forward(stream, a_.data(), batch, k_, k_);
  blas.sgemv(Transpose::kNo, batch, k_, 1.0f, a_.data(), k_, params.values(out_w_), 1.0f, logits);
}

void FlenPart::backward(const Blas& blas, DenseParameters& params, const float* dlogits,
                        int64_t batch, float grad_scale, const MlpDropout& dropout,
                        float* d_pooled) {
  const device::Stream& stream = blas.stream();
  const FlenShape shape = make_shape(groups_, k_, slot_width_, embed_column_, starts_);
  const auto cells = static_cast<std::size_t>(batch) * static_cast<std::size_t>(k_);
  device::parallel_for(stream, cells,
                       FlenOutputGrad{dlogits, params.values(out_w_), a_.data(), du_.data(), k_,
                                      dropout.side_grad_scale()});
  // dh = du W^T; the rows' gradient and q read it.
  blas.sgemm(Transpose::kNo, Transpose::kYes, batch, k_, k_, 1.0f, du_.data(), k_,
             params.values(fc_w_), k_, 0.0f, dh_.data(), k_);
  device::parallel_for(stream, cells,
                       FlenRowsBackward{params.values(kernel_mf_), g_.data(), dh_.data(), d_pooled,
                                        int64_t{slots_} * slot_width_, shape});
  device::parallel_for(stream, static_cast<std::size_t>(batch) * static_cast<std::size_t>(pairs()),
                       FlenPairGrad{g_.data(), dh_.data(), q_.data(), pairs(), shape});
  // The parameters' gradients: sums over the batch, scaled.
  blas.sgemv(Transpose::kYes, batch, pairs(), grad_scale, q_.data(), pairs(), ones_.data(), 0.0f,
             params.grads(kernel_mf_));
  blas.sgemm(Transpose::kYes, Transpose::kNo, k_, k_, batch, grad_scale, h_.data(), k_, du_.data(),
             k_, 0.0f, params.grads(fc_w_), k_);
  blas.sgemv(Transpose::kYes, batch, k_, grad_scale, du_.data(), k_, ones_.data(), 0.0f,
             params.grads(fc_b_));
  blas.sgemv(Transpose::kYes, batch, k_, grad_scale, a_.data(), k_, dlogits, 0.0f,
             params.grads(out_w_));
}

}  // namespace gpubox::trainer
