// ffm's field-aware pairwise term (FfmPart, layers.hpp). Portable: parallel_for over instances
// (forward, the pooled gradient) and over the dense features' factor values (their gradient,
// each summed over the batch by one thread in instance order).
#include <cmath>
#include <type_traits>

#include "common/error.hpp"
#include "heterps/device/parallel_for.cuh"
#include "trainer/nn/bf16.hpp"
#include "trainer/nn/layers.hpp"

namespace gpubox::trainer {
namespace {

// Field a's factor toward field b of one instance: a sparse slot's k values in its pooled row, or
// a dense feature's value times its k values of dense_v. Loops over c call at(c) with the choice
// fixed, so the compiler hoists it out of them (no branch, no index arithmetic per value).
template <class T>
struct FactorRow {
  const T* slot;       // the slot's factor, or nullptr for a dense feature
  const float* dense;  // the dense feature's dense_v row
  float x;             // the dense feature's value
  GPUBOX_HD float at(int c) const { return slot != nullptr ? to_float(slot[c]) : x * dense[c]; }
};

// Where field a's factor toward field b sits, for one instance: a sparse slot's in its pooled
// row (columns a * width + embedx_column + b * k ..), a dense feature's in dense_v scaled by the
// feature's value.
struct FfmShape {
  int slots;
  int fields;
  int k;
  int width;
  int embedx_column;
  int dense_dim;

  // V(a, b) of the instance whose pooled row is `row` and dense features `x`.
  template <class T>
  GPUBOX_HD FactorRow<T> factor_row(const T* row, const float* x, const float* dense_v, int a,
                                    int b) const {
    if (a < slots) return FactorRow<T>{row + a * width + embedx_column + b * k, nullptr, 0.0f};
    const int d = a - slots;
    return FactorRow<T>{nullptr, dense_v + (static_cast<int64_t>(d) * fields + b) * k, x[d]};
  }
};

// logits[i] += sum_{a < b} <V(a, b), V(b, a)>.
template <class T>
struct FfmForward {
  const T* rows;
  int64_t ld;
  const float* dense;
  const float* dense_v;
  float* logits;
  FfmShape shape;
  GPUBOX_HD void operator()(std::size_t i) const {
    const T* row = rows + static_cast<int64_t>(i) * ld;
    const float* x = dense + static_cast<int64_t>(i) * shape.dense_dim;
    float sum = 0.0f;
    for (int a = 0; a < shape.fields; ++a) {
      for (int b = a + 1; b < shape.fields; ++b) {
        const FactorRow<T> ab = shape.factor_row(row, x, dense_v, a, b);
        const FactorRow<T> ba = shape.factor_row(row, x, dense_v, b, a);
        for (int c = 0; c < shape.k; ++c) sum += ab.at(c) * ba.at(c);
      }
    }
    logits[i] += sum;
  }
};

// d ffm_i / d V(a, b) = V(b, a) for a != b: the sparse slots' factors, times dlogits[i], added to
// the pooled gradient (d_ld: its row stride).
template <class T>
struct FfmPooledBackward {
  const T* rows;
  int64_t ld;
  const float* dense;
  const float* dense_v;
  const float* dlogits;
  float* d_pooled;
  int64_t d_ld;
  FfmShape shape;
  GPUBOX_HD void operator()(std::size_t i) const {
    const T* row = rows + static_cast<int64_t>(i) * ld;
    const float* x = dense + static_cast<int64_t>(i) * shape.dense_dim;
    float* d_row = d_pooled + static_cast<int64_t>(i) * d_ld + shape.embedx_column;
    const float g = dlogits[i];
    for (int a = 0; a < shape.slots; ++a) {
      for (int b = 0; b < shape.fields; ++b) {
        if (b == a) continue;
        const FactorRow<T> ba = shape.factor_row(row, x, dense_v, b, a);
        float* out = d_row + a * shape.width + b * shape.k;
        for (int c = 0; c < shape.k; ++c) out[c] += g * ba.at(c);
      }
    }
  }
};

// d loss / d dense_v[d, b, c] = scale * sum_i dlogits[i] x_id V_i(b, S + d)[c] (0 for b = S + d:
// a field meets no factor of its own). One thread per value, instances in order.
template <class T>
struct FfmDenseBackward {
  const T* rows;
  int64_t ld;
  const float* dense;
  const float* dense_v;
  const float* dlogits;
  int64_t batch;
  float scale;
  float* grads;
  FfmShape shape;
  GPUBOX_HD void operator()(std::size_t j) const {
    const int c = static_cast<int>(j % shape.k);
    const int b = static_cast<int>((j / shape.k) % shape.fields);
    const int d = static_cast<int>(j / (static_cast<std::size_t>(shape.k) * shape.fields));
    const int a = shape.slots + d;
    double sum = 0.0;
    if (b != a) {
      for (int64_t i = 0; i < batch; ++i) {
        const float* x = dense + i * shape.dense_dim;
        sum += static_cast<double>(dlogits[i] * x[d]) *
               shape.factor_row(rows + i * ld, x, dense_v, b, a).at(c);
      }
    }
    grads[j] = static_cast<float>(scale * sum);
  }
};

// Calls launch(rows) with the input rows typed as they are stored.
template <class Launch>
void with_row_type(const InputRows& input, Launch launch) {
  if (input.type == ElementType::kBf16) {
    launch(static_cast<const Bf16*>(input.data));
  } else {
    launch(static_cast<const float*>(input.data));
  }
}
}  // namespace

FfmPart::FfmPart(DenseParameters& params, const SlotSumPool& pool, int dense_dim)
    : slots_(pool.slots()),
      dense_dim_(dense_dim),
      k_(0),
      width_(pool.width()),
      embedx_column_(pool.embed_w_column() + 1) {
  GPUBOX_EXPECTS(pool.uniform(),
                 "ffm gives every field's factor one width, but hyper_parameters.slot_dims gives "
                 "the slots different widths; leave slot_dims empty");
  GPUBOX_EXPECTS(dense_dim >= 0, "ffm: dense_input_dim must be >= 0, got ", dense_dim);
  const int fields = slots_ + dense_dim;
  GPUBOX_EXPECTS(fields >= 1 && pool.mf_dim() > 0 && pool.mf_dim() % fields == 0,
                 "ffm's rows hold one factor per field: their embedx width (", pool.mf_dim(),
                 ") must be a multiple of the fields (", slots_, " sparse slots + ", dense_dim,
                 " dense features = ", fields,
                 "); the config loader sets it from "
                 "hyper_parameters.sparse_feature_dim");
  k_ = pool.mf_dim() / fields;
  const auto count = static_cast<std::size_t>(dense_dim) * fields * k_;
  dense_v_ = params.add("ffm.dense_v", count, ParamInit::kNormal,
                        0.1f / std::sqrt(static_cast<float>(k_)));
}

double FfmPart::flops_per_example() const {
  const double pairs = 0.5 * fields() * (fields() - 1.0);
  return 2.0 * 3.0 * k_ * pairs;
}

void FfmPart::forward(const device::Stream& stream, const DenseParameters& params,
                      const InputRows& input, const float* dense, int64_t batch,
                      float* logits) const {
  const FfmShape shape{slots_, fields(), k_, width_, embedx_column_, dense_dim_};
  with_row_type(input, [&](const auto* rows) {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(rows)>>;
    device::parallel_for(
        stream, static_cast<std::size_t>(batch),
        FfmForward<T>{rows, input.ld, dense, params.values(dense_v_), logits, shape});
  });
}

void FfmPart::backward(const device::Stream& stream, DenseParameters& params,
                       const InputRows& input, const float* dense, const float* dlogits,
                       int64_t batch, float grad_scale, float* d_pooled) const {
  const FfmShape shape{slots_, fields(), k_, width_, embedx_column_, dense_dim_};
  const float* dense_v = params.values(dense_v_);
  with_row_type(input, [&](const auto* rows) {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(rows)>>;
    device::parallel_for(stream, static_cast<std::size_t>(batch),
                         FfmPooledBackward<T>{rows, input.ld, dense, dense_v, dlogits, d_pooled,
                                              int64_t{slots_} * width_, shape});
    device::parallel_for(stream, static_cast<std::size_t>(dense_dim_) * fields() * k_,
                         FfmDenseBackward<T>{rows, input.ld, dense, dense_v, dlogits, batch,
                                             grad_scale, params.grads(dense_v_), shape});
  });
}

}  // namespace gpubox::trainer
