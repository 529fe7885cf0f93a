// xdeepfm's field embeddings and CIN (XdeepfmPart, xdeepfm_part.hpp): forward and backward.
// Portable: GEMMs through the card's Blas, the rest parallel_for over items that each own the
// values they write (no atomics; sums in a fixed order, so runs are deterministic).
//
// Backward of layer k from G = scale * dL/dX^{k+1} ([(B D) x H_{k+1}]), with Z_k built again:
//   dW_k = Z_k^T G,  dZ = G W_k^T,
//   dL/dX^0[f, d] += sum_h dZ[(b, d), f H_k + h] X^k[h, d],
//   dL/dX^k[h, d]  = sum_f dZ[(b, d), f H_k + h] X^0[f, d] (+ the pooling's share of X^k);
// for k = 0, X^k is X^0 and both terms are X^0's.
#include <utility>

#include "common/error.hpp"
#include "heterps/device/parallel_for.cuh"
#include "trainer/nn/xdeepfm_part.hpp"

namespace gpubox::trainer {
namespace {

// A per-instance [D x H] matrix of a batch: element (b, d, h) at data[b b_stride + d d_stride +
// h]. X^0 lives in the DNN input rows ({x0, dnn_ld, F}); X^k, k >= 1, is [(B D) x H_k]
// ({x, D H_k, H_k}).
template <class T>
struct FieldView {
  T* data;
  int64_t b_stride;
  int64_t d_stride;
  GPUBOX_HD T& at(int64_t b, int64_t d, int64_t h) const {
    return data[b * b_stride + d * d_stride + h];
  }
};

// Item (b, c) of the DNN input: column c < F D is X^0[f = c % F, d = c / F] (slot f's pooled
// embedx_w[d], or dense feature i's x_i e_i[d]); the ones behind it are the slots' cvm features.
struct BuildInput {
  const float* pooled;
  int64_t pooled_ld;
  const float* dense;
  const float* dense_w;
  float* x0;
  int64_t ld;
  int cols;
  int slots;
  int dense_dim;
  int width;
  int slot_width;
  int embedx_column;
  GPUBOX_HD void operator()(std::size_t item) const {
    const auto b = static_cast<int64_t>(item / static_cast<std::size_t>(cols));
    const int c = static_cast<int>(item % static_cast<std::size_t>(cols));
    const int fields = slots + dense_dim;
    const float* row = pooled + b * pooled_ld;
    float value;
    if (c < fields * width) {
      const int f = c % fields, d = c / fields;
      value = f < slots ? row[f * slot_width + embedx_column + d]
                        : dense[b * dense_dim + (f - slots)] * dense_w[(f - slots) * width + d];
    } else {
      const int cvm = c - fields * width;
      value = row[(cvm / 2) * slot_width + cvm % 2];
    }
    x0[b * ld + c] = value;
  }
};

// Item (r = b D + d, f): Z[r, f H + h] = X^0[b, d, f] X^k[b, d, h] for every h (one item per
// H values: the index arithmetic is paid once per row segment, not per value).
struct OuterProducts {
  FieldView<const float> x0;
  FieldView<const float> prev;
  float* z;
  int width;
  int fields;
  int height;
  GPUBOX_HD void operator()(std::size_t item) const {
    const auto r = static_cast<int64_t>(item / static_cast<std::size_t>(fields));
    const auto f = static_cast<int64_t>(item % static_cast<std::size_t>(fields));
    const int64_t b = r / width, d = r % width;
    const float scale = x0.at(b, d, f);
    const float* in = &prev.at(b, d, 0);
    float* out = z + static_cast<int64_t>(item) * height;
    for (int64_t h = 0; h < height; ++h) out[h] = scale * in[h];
  }
};

// pooled[b, offset + o] = sum_d X[(b, d), o].
struct SumOverWidth {
  const float* x;
  float* pooled;
  int64_t pooled_ld;
  int offset;
  int width;
  int height;
  GPUBOX_HD void operator()(std::size_t item) const {
    const auto b = static_cast<int64_t>(item / static_cast<std::size_t>(height));
    const auto o = static_cast<int64_t>(item % static_cast<std::size_t>(height));
    float sum = 0.0f;
    for (int64_t d = 0; d < width; ++d) sum += x[(b * width + d) * height + o];
    pooled[b * pooled_ld + offset + o] = sum;
  }
};

// dp[b, j] = scale * dlogits[b] * w_out[j].
struct PooledGrad {
  const float* dlogits;
  const float* w_out;
  float* dp;
  float scale;
  int cols;
  GPUBOX_HD void operator()(std::size_t item) const {
    const std::size_t b = item / static_cast<std::size_t>(cols);
    dp[item] = scale * dlogits[b] * w_out[item % static_cast<std::size_t>(cols)];
  }
};

// X^0[b, d, f] (+)= sum_h dZ[(b, d), f H + h] X^k[b, d, h].
struct FirstFieldGrad {
  const float* dz;
  FieldView<const float> prev;
  FieldView<float> dx0;
  int width;
  int fields;
  int height;
  GPUBOX_HD void operator()(std::size_t item) const {
    const auto r = static_cast<int64_t>(item / static_cast<std::size_t>(fields));
    const auto f = static_cast<int64_t>(item % static_cast<std::size_t>(fields));
    const int64_t b = r / width, d = r % width;
    const float* row = dz + (r * fields + f) * height;
    float sum = 0.0f;
    for (int64_t h = 0; h < height; ++h) sum += row[h] * prev.at(b, d, h);
    dx0.at(b, d, f) += sum;
  }
#if !defined(GPUBOX_BACKEND_CUDA)
  // cpu: up to kGroup fields of one row at a time, their sums side by side in the loop over h
  // (independent chains the core overlaps, each in operator()'s order; one chain alone waits on
  // every addition), X^k's row read once for the group.
  static constexpr int kGroup = 4;
  void run_range(std::size_t begin, std::size_t end) const {
    device::for_row_segments(begin, end, fields, [this](int64_t r, int64_t f0, int64_t f1) {
      const int64_t b = r / width, d = r % width;
      const float* __restrict__ in = &prev.at(b, d, 0);
      for (int64_t f = f0; f < f1; f += kGroup) {
        const int64_t n = f1 - f < kGroup ? f1 - f : kGroup;
        // A short group's missing lanes repeat its last row (summed, not stored).
        const float* lanes[kGroup];
        for (int64_t g = 0; g < kGroup; ++g) {
          lanes[g] = dz + (r * fields + f + (g < n ? g : n - 1)) * height;
        }
        float sum[kGroup] = {};
        for (int64_t h = 0; h < height; ++h) {
          for (int64_t g = 0; g < kGroup; ++g) sum[g] += lanes[g][h] * in[h];
        }
        for (int64_t g = 0; g < n; ++g) dx0.at(b, d, f + g) += sum[g];
      }
    });
  }
#endif
};

// out[b, d, h] = (accumulate ? out : 0) + dp[b, offset + h] (when dp is set) +
// sum_f dZ[(b, d), f H + h] X^0[b, d, f] (when dz is set).
struct PrevFieldGrad {
  const float* dz;
  const float* dp;
  int64_t dp_ld;
  int offset;
  FieldView<const float> x0;
  FieldView<float> out;
  int width;
  int fields;
  int height;
  bool accumulate;
  GPUBOX_HD void operator()(std::size_t item) const {
    const auto r = static_cast<int64_t>(item / static_cast<std::size_t>(height));
    const auto h = static_cast<int64_t>(item % static_cast<std::size_t>(height));
    const int64_t b = r / width, d = r % width;
    float sum = dp != nullptr ? dp[b * dp_ld + offset + h] : 0.0f;
    if (dz != nullptr) {
      const float* row = dz + r * fields * height + h;
      for (int64_t f = 0; f < fields; ++f) sum += row[f * height] * x0.at(b, d, f);
    }
    float& target = out.at(b, d, h);
    target = accumulate ? target + sum : sum;
  }
#if !defined(GPUBOX_BACKEND_CUDA)
  // cpu: a row's h in chunks of kChunk sums, f outer and h inner, so that dZ is read along its
  // rows and the loop over h vectorizes; each sum adds over f in operator()'s order.
  static constexpr int64_t kChunk = 32;
  void run_range(std::size_t begin, std::size_t end) const {
    device::for_row_segments(begin, end, height, [this](int64_t r, int64_t h0, int64_t h1) {
      const int64_t b = r / width, d = r % width;
      for (int64_t c = h0; c < h1; c += kChunk) {
        const int64_t n = h1 - c < kChunk ? h1 - c : kChunk;
        float sum[kChunk];
        for (int64_t h = 0; h < n; ++h)
          sum[h] = dp != nullptr ? dp[b * dp_ld + offset + c + h] : 0.0f;
        for (int64_t f = 0; dz != nullptr && f < fields; ++f) {
          const float* __restrict__ row = dz + (r * fields + f) * height + c;
          const float scale = x0.at(b, d, f);
          for (int64_t h = 0; h < n; ++h) sum[h] += row[h] * scale;
        }
        float* __restrict__ target = &out.at(b, d, c);
        for (int64_t h = 0; h < n; ++h) target[h] = accumulate ? target[h] + sum[h] : sum[h];
      }
    });
  }
#endif
};

// d_pooled[b, c] = unscale * dL/dX^0 for slot c / slot_width's embedx column, 0 elsewhere.
struct ScatterPooledGrad {
  const float* dx0;
  int64_t ld;
  float* d_pooled;
  int pooled_cols;
  int slot_width;
  int embedx_column;
  int fields;
  float unscale;
  GPUBOX_HD void operator()(std::size_t item) const {
    const auto b = static_cast<int64_t>(item / static_cast<std::size_t>(pooled_cols));
    const int c = static_cast<int>(item % static_cast<std::size_t>(pooled_cols));
    const int s = c / slot_width, d = c % slot_width - embedx_column;
    d_pooled[item] = d >= 0 ? unscale * dx0[b * ld + d * fields + s] : 0.0f;
  }
};

// grad[i, d] = sum_b dL/dX^0[b, d, slots + i] x_i (dL/dX^0 already scaled).
struct DenseEmbeddingGrad {
  const float* dx0;
  int64_t ld;
  const float* dense;
  float* grad;
  int64_t batch;
  int slots;
  int dense_dim;
  int width;
  GPUBOX_HD void operator()(std::size_t item) const {
    const auto i = static_cast<int>(item / static_cast<std::size_t>(width));
    const auto d = static_cast<int>(item % static_cast<std::size_t>(width));
    const int column = d * (slots + dense_dim) + slots + i;
    float sum = 0.0f;
    for (int64_t b = 0; b < batch; ++b) sum += dx0[b * ld + column] * dense[b * dense_dim + i];
    grad[item] = sum;
  }
};

std::size_t items(int64_t a, int64_t b) { return static_cast<std::size_t>(a * b); }
}  // namespace

void XdeepfmPart::build_z(const device::Stream& stream, int k, int64_t batch) {
  const int height = this->height(k);
  const FieldView<const float> x0{x0_.data(), dnn_ld_, fields()};
  const FieldView<const float> prev =
      k == 0 ? x0
             : FieldView<const float>{xs_[static_cast<std::size_t>(k - 1)].data(),
                                      static_cast<int64_t>(width_) * height, height};
  device::parallel_for(stream, items(batch * width_, fields()),
                       OuterProducts{x0, prev, z_.data(), width_, fields(), height});
}

void XdeepfmPart::forward(const Blas& blas, const DenseParameters& params, const InputRows& x0,
                          const float* dense, int64_t batch) {
  GPUBOX_EXPECTS(x0.type == ElementType::kF32, "xdeepfm reads the pooled slots as fp32");
  const device::Stream& stream = blas.stream();
  device::parallel_for(
      stream, items(batch, dnn_in()),
      BuildInput{static_cast<const float*>(x0.data), x0.ld, dense,
                 dense_dim_ > 0 ? params.values(dense_w_) : nullptr, x0_.data(), dnn_ld_, dnn_in(),
                 slots_, dense_dim_, width_, slot_width_, embedx_column_});
  const int64_t rows = batch * width_;
  int offset = 0;
  for (std::size_t k = 0; k < sizes_.size(); ++k) {
    const int64_t in = layer_in(static_cast<int>(k));
    build_z(stream, static_cast<int>(k), batch);
    blas.sgemm(Transpose::kNo, Transpose::kNo, rows, sizes_[k], in, 1.0f, z_.data(), in,
               params.values(w_[k]), sizes_[k], 0.0f, xs_[k].data(), sizes_[k]);
    device::parallel_for(
        stream, items(batch, sizes_[k]),
        SumOverWidth{xs_[k].data(), pooled_.data(), pooled_cols(), offset, width_, sizes_[k]});
    offset += sizes_[k];
  }
}

void XdeepfmPart::add_logits(const Blas& blas, const DenseParameters& params, int64_t batch,
                             float* logits) const {
  blas.sgemv(Transpose::kNo, batch, pooled_cols(), 1.0f, pooled_.data(), pooled_cols(),
             params.values(w_out_), 1.0f, logits);
}

void XdeepfmPart::backward(const Blas& blas, DenseParameters& params, const float* dense,
                           const float* dlogits, float scale, int64_t batch, float unscale,
                           float* d_pooled) {
  const device::Stream& stream = blas.stream();
  const int sum = pooled_cols();
  device::parallel_for(
      stream, items(batch, sum),
      PooledGrad{dlogits, params.values(w_out_), d_pooled_cin_.data(), scale, sum});
  blas.sgemv(Transpose::kYes, batch, sum, scale, pooled_.data(), sum, dlogits, 0.0f,
             params.grads(w_out_));
  const FieldView<const float> x0{x0_.data(), dnn_ld_, fields()};
  const FieldView<float> dx0{dx0_.data(), dnn_ld_, fields()};
  const int64_t rows = batch * width_;
  const int layers = static_cast<int>(sizes_.size());
  float* g = g_a_.data();
  float* spare = g_b_.data();
  int offset = sum - sizes_.back();  // X^K's columns of p
  device::parallel_for(
      stream, items(rows, sizes_.back()),
      PrevFieldGrad{
          nullptr, d_pooled_cin_.data(), sum, offset, x0,
          FieldView<float>{g, static_cast<int64_t>(width_) * sizes_.back(), sizes_.back()}, width_,
          fields(), sizes_.back(), false});
  for (int k = layers; k-- > 0;) {
    const int out = sizes_[static_cast<std::size_t>(k)], height = this->height(k);
    const int64_t in = layer_in(k);
    build_z(stream, k, batch);
    blas.sgemm(Transpose::kYes, Transpose::kNo, in, out, rows, 1.0f, z_.data(), in, g, out, 0.0f,
               params.grads(w_[static_cast<std::size_t>(k)]), out);
    blas.sgemm(Transpose::kNo, Transpose::kYes, rows, in, out, 1.0f, g, out,
               params.values(w_[static_cast<std::size_t>(k)]), out, 0.0f, z_.data(), in);
    const FieldView<const float> prev =
        k == 0 ? x0
               : FieldView<const float>{xs_[static_cast<std::size_t>(k - 1)].data(),
                                        static_cast<int64_t>(width_) * height, height};
    device::parallel_for(stream, items(rows, fields()),
                         FirstFieldGrad{z_.data(), prev, dx0, width_, fields(), height});
    if (k > 0) {
      offset -= height;
      const FieldView<float> next{spare, static_cast<int64_t>(width_) * height, height};
      device::parallel_for(stream, items(rows, height),
                           PrevFieldGrad{z_.data(), d_pooled_cin_.data(), sum, offset, x0, next,
                                         width_, fields(), height, false});
      std::swap(g, spare);
    } else {
      device::parallel_for(
          stream, items(rows, fields()),
          PrevFieldGrad{z_.data(), nullptr, 0, 0, x0, dx0, width_, fields(), fields(), true});
    }
  }
  const int pool_cols = slots_ * slot_width_;
  device::parallel_for(stream, items(batch, pool_cols),
                       ScatterPooledGrad{dx0_.data(), dnn_ld_, d_pooled, pool_cols, slot_width_,
                                         embedx_column_, fields(), unscale});
  if (dense_dim_ > 0) {
    device::parallel_for(stream, items(dense_dim_, width_),
                         DenseEmbeddingGrad{dx0_.data(), dnn_ld_, dense, params.grads(dense_w_),
                                            batch, slots_, dense_dim_, width_});
  }
}

}  // namespace gpubox::trainer
