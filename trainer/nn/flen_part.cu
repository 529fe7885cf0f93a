// flen's field-wise bi-interaction (FlenPart, flen_part.hpp). Portable: parallel_for per instance
// and per parameter.
#include <cmath>
#include <sstream>
#include <type_traits>

#include "common/error.hpp"
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

// The pair after (a, b) in itertools.combinations order.
GPUBOX_HD inline void next_pair(int groups, int* a, int* b) {
  if (++*b == groups) {
    ++*a;
    *b = *a + 1;
  }
}

// Per instance: the group sums g, h, a = relu(h W + b) and logits[i] += a . w_out.
template <class T>
struct FlenForward {
  const T* rows;
  int64_t ld;
  const float* kernel_mf;
  const float* fc_w;
  const float* fc_b;
  const float* out_w;
  float* g;
  float* h;
  float* act;
  float* logits;
  FlenShape s;
  GPUBOX_HD void operator()(std::size_t i) const {
    const T* row = rows + static_cast<int64_t>(i) * ld;
    const int k = s.k;
    float* gi = g + static_cast<int64_t>(i) * s.groups * k;
    float* hi = h + static_cast<int64_t>(i) * k;
    float* ai = act + static_cast<int64_t>(i) * k;
    for (int j = 0; j < s.groups; ++j) {
      for (int c = 0; c < k; ++c) {
        float sum = 0.0f;
        for (int slot = s.starts[j]; slot < s.starts[j + 1]; ++slot) {
          sum += to_float(row[slot * s.slot_width + s.embed_column + c]);
        }
        gi[j * k + c] = sum;
      }
    }
    for (int c = 0; c < k; ++c) hi[c] = 0.0f;
    int a = 0;
    int b = 1;
    for (int p = 0; a < s.groups - 1; ++p, next_pair(s.groups, &a, &b)) {
      for (int c = 0; c < k; ++c) hi[c] += kernel_mf[p] * gi[a * k + c] * gi[b * k + c];
    }
    float logit = 0.0f;
    for (int o = 0; o < k; ++o) {
      float u = fc_b[o];
      for (int c = 0; c < k; ++c) u += hi[c] * fc_w[c * k + o];
      ai[o] = u > 0.0f ? u : 0.0f;
      logit += ai[o] * out_w[o];
    }
    logits[i] += logit;
  }
};

// Per instance: du, dh (kept for the parameters' gradients) and the slots' embedding gradient
// added to d_pooled: dL/d e_s = dL/d g_j for s in group j.
struct FlenRowsBackward {
  const float* kernel_mf;
  const float* fc_w;
  const float* out_w;
  const float* dlogits;
  const float* g;
  const float* act;
  float* du;
  float* dh;
  float* d_pooled;
  int64_t d_ld;
  FlenShape s;
  GPUBOX_HD void operator()(std::size_t i) const {
    const int k = s.k;
    const float* gi = g + static_cast<int64_t>(i) * s.groups * k;
    const float* ai = act + static_cast<int64_t>(i) * k;
    float* dui = du + static_cast<int64_t>(i) * k;
    float* dhi = dh + static_cast<int64_t>(i) * k;
    for (int o = 0; o < k; ++o) dui[o] = ai[o] > 0.0f ? dlogits[i] * out_w[o] : 0.0f;
    for (int c = 0; c < k; ++c) {
      float sum = 0.0f;
      for (int o = 0; o < k; ++o) sum += fc_w[c * k + o] * dui[o];
      dhi[c] = sum;
    }
    float* d_row = d_pooled + static_cast<int64_t>(i) * d_ld;
    for (int j = 0; j < s.groups; ++j) {
      for (int c = 0; c < k; ++c) {
        // d h / d g_j = r_p g_other for every pair p holding j.
        float dg = 0.0f;
        int a = 0;
        int b = 1;
        for (int p = 0; a < s.groups - 1; ++p, next_pair(s.groups, &a, &b)) {
          if (a == j) dg += kernel_mf[p] * gi[b * k + c];
          if (b == j) dg += kernel_mf[p] * gi[a * k + c];
        }
        dg *= dhi[c];
        for (int slot = s.starts[j]; slot < s.starts[j + 1]; ++slot) {
          d_row[slot * s.slot_width + s.embed_column + c] += dg;
        }
      }
    }
  }
};

// One item per parameter value, its gradient summed over the batch in instance order (double),
// times the dense scale: kernel_mf [P], then fc_w [k x k], fc_b [k], out_w [k].
struct FlenParamBackward {
  const float* dlogits;
  const float* g;
  const float* h;
  const float* act;
  const float* du;
  const float* dh;
  int64_t batch;
  float scale;
  int pairs;
  float* d_kernel_mf;
  float* d_fc_w;
  float* d_fc_b;
  float* d_out_w;
  FlenShape s;
  GPUBOX_HD void operator()(std::size_t item) const {
    const int k = s.k;
    const auto j = static_cast<int64_t>(item);
    double sum = 0.0;
    if (j < pairs) {
      int a = 0;
      int b = 1;
      for (int p = 0; p < j; ++p) next_pair(s.groups, &a, &b);
      for (int64_t i = 0; i < batch; ++i) {
        const float* gi = g + i * s.groups * k;
        for (int c = 0; c < k; ++c) {
          sum += static_cast<double>(dh[i * k + c]) * gi[a * k + c] * gi[b * k + c];
        }
      }
      d_kernel_mf[j] = static_cast<float>(scale * sum);
      return;
    }
    const int64_t w = j - pairs;
    if (w < int64_t{k} * k) {
      const int64_t c = w / k;
      const int64_t o = w % k;
      for (int64_t i = 0; i < batch; ++i) sum += static_cast<double>(h[i * k + c]) * du[i * k + o];
      d_fc_w[w] = static_cast<float>(scale * sum);
      return;
    }
    const int64_t o = (w - int64_t{k} * k) % k;
    if (w - int64_t{k} * k < k) {
      for (int64_t i = 0; i < batch; ++i) sum += du[i * k + o];
      d_fc_b[o] = static_cast<float>(scale * sum);
    } else {
      for (int64_t i = 0; i < batch; ++i) sum += static_cast<double>(dlogits[i]) * act[i * k + o];
      d_out_w[o] = static_cast<float>(scale * sum);
    }
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
    : slots_(pool.slots()),
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
  for (auto* buffer : {&g_, &h_, &a_, &du_, &dh_}) *buffer = card.make_buffer<float>(0);
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
      << " group pairs, " << k_ << " x " << k_ << " fc: parallel_for (fp32, batch " << batch << ")";
  return out.str();
}

void FlenPart::reserve(int64_t batch) {
  const auto n = static_cast<std::size_t>(batch) * static_cast<std::size_t>(k_);
  g_.resize_discard(n * static_cast<std::size_t>(groups_));
  for (auto* buffer : {&h_, &a_, &du_, &dh_}) buffer->resize_discard(n);
}

void FlenPart::forward(const device::Stream& stream, const DenseParameters& params,
                       const InputRows& input, int64_t batch, float* logits) {
  FlenShape shape{groups_, k_, slot_width_, embed_column_, {}};
  for (int j = 0; j <= groups_; ++j) shape.starts[j] = starts_[j];
  with_row_type(input, [&](const auto* rows) {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(rows)>>;
    device::parallel_for(
        stream, static_cast<std::size_t>(batch),
        FlenForward<T>{rows, input.ld, params.values(kernel_mf_), params.values(fc_w_),
                       params.values(fc_b_), params.values(out_w_), g_.data(), h_.data(), a_.data(),
                       logits, shape});
  });
}

void FlenPart::backward(const device::Stream& stream, DenseParameters& params, const float* dlogits,
                        int64_t batch, float grad_scale, float* d_pooled) {
  FlenShape shape{groups_, k_, slot_width_, embed_column_, {}};
  for (int j = 0; j <= groups_; ++j) shape.starts[j] = starts_[j];
  device::parallel_for(
      stream, static_cast<std::size_t>(batch),
      FlenRowsBackward{params.values(kernel_mf_), params.values(fc_w_), params.values(out_w_),
                       dlogits, g_.data(), a_.data(), du_.data(), dh_.data(), d_pooled,
                       int64_t{slots_} * slot_width_, shape});
  const std::size_t items = static_cast<std::size_t>(pairs()) + static_cast<std::size_t>(k_) * k_ +
                            2 * static_cast<std::size_t>(k_);
  device::parallel_for(
      stream, items,
      FlenParamBackward{dlogits, g_.data(), h_.data(), a_.data(), du_.data(), dh_.data(), batch,
                        grad_scale, pairs(), params.grads(kernel_mf_), params.grads(fc_w_),
                        params.grads(fc_b_), params.grads(out_w_), shape});
}

}  // namespace gpubox::trainer
