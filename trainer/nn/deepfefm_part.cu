// deepfefm's field-embedded FM (DeepfefmPart, deepfefm_part.hpp): its blocks, buffers, forward
// and backward. Portable: parallel_for over items that each own the values they write (no
// atomics; sums in a fixed order, so runs are deterministic).
//
// Backward from dr_p = scale * (dL/dr_p through the DNN + dlogits) and M_p = W_p + W_p^T
// (symmetric, so d r_p / d v_a = M_p v_b and d r_p / d v_b = M_p v_a):
//   dv_f   = [dL/d(DNN input) at slot f's columns] + sum_{g != f} dr_{pair(f, g)} M_pair v_g
//   dW_p   = sum_i dr_p (v_a v_b^T + v_b v_a^T)
//   de_d   = sum_i dv_{S+d} x_d,   d wide.dense_w[d] += sum_i dL/d(x_d w_d) x_d
#include <cmath>
#include <sstream>
#include <vector>

#include "common/error.hpp"
#include "heterps/device/isa_clones.cuh"
#include "heterps/device/parallel_for.cuh"
#include "trainer/nn/activation_layout.hpp"
#include "trainer/nn/deepfefm_part.hpp"

namespace gpubox::trainer {
namespace {
// Columns of M v that sym_times makes at once (a local array: registers on a GPU, two SSE
// vectors on the cpu); sym is padded by as many floats.
constexpr int kSymChunk = 8;

std::size_t items(int64_t a, int64_t b) { return static_cast<std::size_t>(a * b); }

// The shape every functor reads. Pairs are numbered in itertools.combinations order.
struct FefmShape {
  int slots;
  int dense_dim;
  int k;
  int64_t ld;  // the DNN input's row stride
  GPUBOX_HD int fields() const { return slots + dense_dim; }
  GPUBOX_HD int pairs() const { return fields() * (fields() - 1) / 2; }
  GPUBOX_HD int pair(int a, int b) const { return a * (2 * fields() - a - 1) / 2 + (b - a - 1); }
  GPUBOX_HD int dense_column() const { return slots * k; }  // x_d w_d's first column
  GPUBOX_HD int pair_column() const { return slots * k + dense_dim; }
  GPUBOX_HD int cvm_column() const { return pair_column() + pairs(); }
};

// sym[p, r, c] = W[p, r, c] + W[p, c, r].
struct Symmetrise {
  const float* w;
  float* sym;
  int k;
  GPUBOX_HD void operator()(std::size_t item) const {
    const std::size_t kk = static_cast<std::size_t>(k) * k;
    const std::size_t p = item / kk, r = (item % kk) / k, c = item % k;
    sym[item] = w[item] + w[p * kk + c * k + r];
  }
};

// Item (b, f): v_f into fields, and field f's DNN input columns (a slot's embedx and its cvm
// features, a dense feature's x_d w_d).
struct BuildFields {
  const float* pooled;
  int64_t pooled_ld;
  const float* dense;
  const float* dense_v;
  const float* dense_w;
  float* fields;
  float* x0;
  FefmShape shape;
  bool use_cvm;
  int slot_width;
  int embedx_column;
  GPUBOX_HD void operator()(std::size_t item) const {
    const int nf = shape.fields(), k = shape.k;
    const auto b = static_cast<int64_t>(item / static_cast<std::size_t>(nf));
    const int f = static_cast<int>(item % static_cast<std::size_t>(nf));
    float* v = fields + static_cast<int64_t>(item) * k;
    float* row = x0 + b * shape.ld;
    if (f < shape.slots) {
      const float* block = pooled + b * pooled_ld + f * slot_width;
      for (int c = 0; c < k; ++c) v[c] = row[f * k + c] = block[embedx_column + c];
      if (use_cvm) {
        row[shape.cvm_column() + 2 * f] = block[0];
        row[shape.cvm_column() + 2 * f + 1] = block[1];
      }
    } else {
      const int d = f - shape.slots;
      const float x = dense[b * shape.dense_dim + d];
      for (int c = 0; c < k; ++c) v[c] = x * dense_v[d * k + c];
      row[shape.dense_column() + d] = x * dense_w[d];
    }
  }
};

// out[i] = (M v)[i0 + i] for i < kSymChunk, M a symmetric k x k block: each sum over j in order
// from 0, M's row j read along i (M[j, i] = M[i, j] to the bit: sym's entries are w[i, j] +
// w[j, i] and w[j, i] + w[i, j]), so that the loop over i has no reduction in it. Always
// kSymChunk columns (a fixed count: the cpu keeps `out` in vector registers); past column k they
// read the next row or sym's padding and are not used.
GPUBOX_HD inline void sym_times(const float* __restrict__ m, const float* __restrict__ v, int k,
                                int i0, float* __restrict__ out) {
  for (int i = 0; i < kSymChunk; ++i) out[i] = 0.0f;
  for (int j = 0; j < k; ++j) {
    const float* __restrict__ row = m + static_cast<int64_t>(j) * k + i0;
    const float vj = v[j];
    GPUBOX_LANES
    for (int i = 0; i < kSymChunk; ++i) out[i] += row[i] * vj;
  }
}

// Item (b, a): r_{pair(a, g)} = v_a^T M v_g for every g > a, into the DNN input's pair columns.
struct PairForward {
  const float* fields;
  const float* sym;
  float* x0;
  FefmShape shape;
  GPUBOX_HD void operator()(std::size_t item) const {
    const int nf = shape.fields(), k = shape.k;
    const auto b = static_cast<int64_t>(item / static_cast<std::size_t>(nf));
    const int a = static_cast<int>(item % static_cast<std::size_t>(nf));
    const float* va = fields + (b * nf + a) * k;
    for (int g = a + 1; g < nf; ++g) {
      const int p = shape.pair(a, g);
      const float* vg = fields + (b * nf + g) * k;
      const float* m = sym + static_cast<int64_t>(p) * k * k;
      float r = 0.0f;
      for (int i0 = 0; i0 < k; i0 += kSymChunk) {
        const int n = k - i0 < kSymChunk ? k - i0 : kSymChunk;
        float mv[kSymChunk];
        sym_times(m, vg, k, i0, mv);
        // A fixed bound (nvcc unrolls it and keeps mv in registers), the tail past n skipped.
        for (int i = 0; i < kSymChunk; ++i) {
          if (i < n) r += va[i0 + i] * mv[i];
        }
      }
      x0[b * shape.ld + shape.pair_column() + p] = r;
    }
  }
};

// logits[b] += sum_p r_p.
struct SumPairs {
  const float* x0;
  float* logits;
  FefmShape shape;
  GPUBOX_HD void operator()(std::size_t b) const {
    const float* r = x0 + static_cast<int64_t>(b) * shape.ld + shape.pair_column();
    float sum = 0.0f;
    for (int p = 0; p < shape.pairs(); ++p) sum += r[p];
    logits[b] += sum;
  }
};

// dr[b, p] = dL/dr_p through the DNN (scaled) + scale * dlogits[b].
struct PairGrad {
  const float* dx0;
  const float* dlogits;
  float* d_pairs;
  float scale;
  FefmShape shape;
  GPUBOX_HD void operator()(std::size_t item) const {
    const int np = shape.pairs();
    const auto b = static_cast<int64_t>(item / static_cast<std::size_t>(np));
    const int p = static_cast<int>(item % static_cast<std::size_t>(np));
    d_pairs[item] = dx0[b * shape.ld + shape.pair_column() + p] + scale * dlogits[b];
  }
};

// Item (b, f): dv_f (see the file comment).
struct FieldGrad {
  const float* fields;
  const float* sym;
  const float* d_pairs;
  const float* dx0;
  float* d_fields;
  FefmShape shape;
  GPUBOX_HD void operator()(std::size_t item) const {
    const int nf = shape.fields(), k = shape.k;
    const auto b = static_cast<int64_t>(item / static_cast<std::size_t>(nf));
    const int f = static_cast<int>(item % static_cast<std::size_t>(nf));
    float* dv = d_fields + static_cast<int64_t>(item) * k;
    for (int c = 0; c < k; ++c) dv[c] = f < shape.slots ? dx0[b * shape.ld + f * k + c] : 0.0f;
    for (int g = 0; g < nf; ++g) {
      if (g == f) continue;
      const int p = f < g ? shape.pair(f, g) : shape.pair(g, f);
      const float dr = d_pairs[b * shape.pairs() + p];
      const float* vg = fields + (b * nf + g) * k;
      const float* m = sym + static_cast<int64_t>(p) * k * k;
      for (int i0 = 0; i0 < k; i0 += kSymChunk) {
        const int n = k - i0 < kSymChunk ? k - i0 : kSymChunk;
        float mv[kSymChunk];
        sym_times(m, vg, k, i0, mv);
        if (n == kSymChunk) {  // a whole chunk: lanes without a mask (the cpu's vectors)
          GPUBOX_LANES
          for (int i = 0; i < kSymChunk; ++i) dv[i0 + i] += dr * mv[i];
        } else {
          for (int i = 0; i < n; ++i) dv[i0 + i] += dr * mv[i];
        }
      }
    }
  }
};

// Item (p, r): dW[p, r, c] = sum_b dr[b, p] (v_a[r] v_g[c] + v_g[r] v_a[c]) for every c, p =
// (a, g). One item per matrix row, so each instance's two field vectors are read once per row,
// not once per value (the batch-strided reads were this kernel's cost).
struct PairWeightGrad {
  const float* fields;
  const float* d_pairs;
  float* grad;
  int64_t batch;
  FefmShape shape;
  GPUBOX_HD void operator()(std::size_t item) const {
    const int nf = shape.fields(), k = shape.k;
    const int p = static_cast<int>(item / static_cast<std::size_t>(k));
    const int r = static_cast<int>(item % static_cast<std::size_t>(k));
    int a = 0;  // the pair's fields: a's pairs are [pair(a, a + 1), pair(a + 1, a + 2))
    while (a + 1 < nf - 1 && shape.pair(a + 1, a + 2) <= p) ++a;
    const int g = p - shape.pair(a, a + 1) + a + 1;
    // kSymChunk columns at a time in a local array (registers; the cpu's vectors), each sum in
    // instance order; columns past k read the next field (or the buffer's padding), unused.
    for (int c0 = 0; c0 < k; c0 += kSymChunk) {
      float sum[kSymChunk] = {};
      for (int64_t b = 0; b < batch; ++b) {
        const float* __restrict__ va = fields + (b * nf + a) * k;
        const float* __restrict__ vg = fields + (b * nf + g) * k;
        const float dr = d_pairs[b * shape.pairs() + p];
        const float ar = dr * va[r], gr = dr * vg[r];
        GPUBOX_LANES
        for (int c = 0; c < kSymChunk; ++c) sum[c] += ar * vg[c0 + c] + gr * va[c0 + c];
      }
      float* out = grad + static_cast<int64_t>(item) * k + c0;
      for (int c = 0; c < kSymChunk && c0 + c < k; ++c) out[c] = sum[c];
    }
  }
};

// d_pooled[b, c] = unscale * dv of slot c / slot_width at its embedx column, 0 elsewhere.
struct ScatterPooledGrad {
  const float* d_fields;
  float* d_pooled;
  int pooled_cols;
  int slot_width;
  int embedx_column;
  float unscale;
  FefmShape shape;
  GPUBOX_HD void operator()(std::size_t item) const {
    const auto b = static_cast<int64_t>(item / static_cast<std::size_t>(pooled_cols));
    const int c = static_cast<int>(item % static_cast<std::size_t>(pooled_cols));
    const int s = c / slot_width, d = c % slot_width - embedx_column;
    d_pooled[item] = d >= 0 ? unscale * d_fields[(b * shape.fields() + s) * shape.k + d] : 0.0f;
  }
};

// Item (d, c): grad[d, c] = sum_b dv_{S+d}[c] x_d (dv already scaled).
struct DenseVectorGrad {
  const float* d_fields;
  const float* dense;
  float* grad;
  int64_t batch;
  FefmShape shape;
  GPUBOX_HD void operator()(std::size_t item) const {
    const int k = shape.k;
    const int d = static_cast<int>(item / static_cast<std::size_t>(k));
    const int c = static_cast<int>(item % static_cast<std::size_t>(k));
    float sum = 0.0f;
    for (int64_t b = 0; b < batch; ++b) {
      sum +=
          d_fields[(b * shape.fields() + shape.slots + d) * k + c] * dense[b * shape.dense_dim + d];
    }
    grad[item] = sum;
  }
};

// Item d: grad[d] += sum_b dL/d(x_d w_d) x_d (scaled).
struct DenseWeightGrad {
  const float* dx0;
  const float* dense;
  float* grad;
  int64_t batch;
  FefmShape shape;
  GPUBOX_HD void operator()(std::size_t d) const {
    float sum = 0.0f;
    for (int64_t b = 0; b < batch; ++b) {
      sum += dx0[b * shape.ld + shape.dense_column() + static_cast<int64_t>(d)] *
             dense[b * shape.dense_dim + static_cast<int64_t>(d)];
    }
    grad[d] += sum;
  }
};
}  // namespace

DeepfefmPart::DeepfefmPart(device::Card& card, DenseParameters& params, const SlotSumPool& pool,
                           const DenseModelConfig& config)
    : slots_(pool.slots()),
      dense_dim_(config.dense_dim),
      width_(pool.mf_dim()),
      use_cvm_(pool.use_cvm()),
      slot_width_(pool.width()),
      embedx_column_(pool.embed_w_column() + 1) {
  GPUBOX_EXPECTS(pool.uniform(),
                 "deepfefm's field pairs multiply the fields' embeddings through k x k matrices, "
                 "so every slot must be as wide as sparse_feature_dim, but "
                 "hyper_parameters.slot_dims gives the slots different widths; remove slot_dims");
  GPUBOX_EXPECTS(fields() >= 2, "deepfefm pairs fields, but the sparse slots (", slots_,
                 ") and hyper_parameters.dense_input_dim (", dense_dim_, ") make ", fields());
  GPUBOX_EXPECTS(width_ >= 1, "deepfefm: sparse_feature_dim must be 2 or more");
  dnn_ld_ = activation_ld(dnn_in());
  // PaddleRec's TruncatedNormal(0, 0.1 / sqrt(sparse_feature_dim)) for both.
  const float std = 0.1f / std::sqrt(static_cast<float>(width_));
  field_w_ = params.add("deepfefm.field_w",
                        static_cast<std::size_t>(pairs()) * static_cast<std::size_t>(width_) *
                            static_cast<std::size_t>(width_),
                        ParamInit::kNormal, std);
  if (dense_dim_ > 0) {
    dense_v_ = params.add("deepfefm.dense_v", static_cast<std::size_t>(dense_dim_) * width_,
                          ParamInit::kNormal, std);
  }
  for (auto* buffer : {&fields_, &x0_, &dx0_, &d_pairs_, &d_fields_}) {
    *buffer = card.make_buffer<float>(0);
  }
  // Padded (zeros) for sym_times' columns past the last row's k.
  sym_ = device::to_device(
      std::vector<float>(static_cast<std::size_t>(pairs()) * width_ * width_ + kSymChunk, 0.0f),
      card.memory(), card.stream());
}

double DeepfefmPart::flops_per_example() const {
  const double k = width_;
  return 2.0 * pairs() * ((k * k + k) + 4.0 * k * k);
}

std::string DeepfefmPart::kernel_report(int64_t batch) const {
  std::ostringstream out;
  out << "\n  fefm " << fields() << " fields x " << width_ << ", " << pairs()
      << " field-pair matrices: parallel_for (fp32, batch " << batch << ")";
  return out.str();
}

void DeepfefmPart::reserve(int64_t batch) {
  const auto n = static_cast<std::size_t>(batch);
  const auto field_values = n * static_cast<std::size_t>(fields()) * width_;
  // Padded for PairWeightGrad's columns past the last field's k (read, never used): the whole
  // allocation zeroed when it grows (it may grow past this batch's need), so that they are never
  // read uninitialised (a smaller batch's padding is values a larger one wrote).
  const bool grows = fields_.capacity() < field_values + kSymChunk;
  fields_.resize_discard(field_values + kSymChunk);
  if (grows) {
    device::memset_bytes_async(fields_.data(), 0, fields_.capacity() * sizeof(float),
                               fields_.stream());
  }
  d_fields_.resize_discard(field_values);
  x0_.resize_discard(n * static_cast<std::size_t>(dnn_ld_));
  dx0_.resize_discard(n * static_cast<std::size_t>(dnn_ld_));
  d_pairs_.resize_discard(n * static_cast<std::size_t>(pairs()));
}

void DeepfefmPart::forward(const device::Stream& stream, const DenseParameters& params,
                           const InputRows& x0, const float* dense, std::size_t dense_w_block,
                           int64_t batch) {
  GPUBOX_EXPECTS(x0.type == ElementType::kF32, "deepfefm reads the pooled slots as fp32");
  const FefmShape shape{slots_, dense_dim_, width_, dnn_ld_};
  device::parallel_for(stream, static_cast<std::size_t>(pairs()) * width_ * width_,
                       Symmetrise{params.values(field_w_), sym_.data(), width_});
  const bool has_dense = dense_dim_ > 0;
  device::parallel_for(
      stream, items(batch, fields()),
      BuildFields{static_cast<const float*>(x0.data), x0.ld, dense,
                  has_dense ? params.values(dense_v_) : nullptr,
                  has_dense ? params.values(dense_w_block) : nullptr, fields_.data(), x0_.data(),
                  shape, use_cvm_, slot_width_, embedx_column_});
  device::parallel_for(
      stream, items(batch, fields()),
      device::isa_clones(PairForward{fields_.data(), sym_.data(), x0_.data(), shape}));
}

void DeepfefmPart::add_logits(const device::Stream& stream, int64_t batch, float* logits) const {
  device::parallel_for(
      stream, static_cast<std::size_t>(batch),
      SumPairs{x0_.data(), logits, FefmShape{slots_, dense_dim_, width_, dnn_ld_}});
}

void DeepfefmPart::backward(const device::Stream& stream, DenseParameters& params,
                            const float* dense, const float* dlogits, float scale, int64_t batch,
                            float unscale, float* d_pooled) {
  const FefmShape shape{slots_, dense_dim_, width_, dnn_ld_};
  device::parallel_for(stream, items(batch, pairs()),
                       PairGrad{dx0_.data(), dlogits, d_pairs_.data(), scale, shape});
  device::parallel_for(stream, items(batch, fields()),
                       device::isa_clones(FieldGrad{fields_.data(), sym_.data(), d_pairs_.data(),
                                                    dx0_.data(), d_fields_.data(), shape}));
  device::parallel_for(stream, items(pairs(), width_),
                       device::isa_clones(PairWeightGrad{fields_.data(), d_pairs_.data(),
                                                         params.grads(field_w_), batch, shape}));
  const int pool_cols = slots_ * slot_width_;
  device::parallel_for(stream, items(batch, pool_cols),
                       ScatterPooledGrad{d_fields_.data(), d_pooled, pool_cols, slot_width_,
                                         embedx_column_, unscale, shape});
  if (dense_dim_ > 0) {
    device::parallel_for(
        stream, items(dense_dim_, width_),
        DenseVectorGrad{d_fields_.data(), dense, params.grads(dense_v_), batch, shape});
  }
}

void DeepfefmPart::add_dense_w_grad(const device::Stream& stream, DenseParameters& params,
                                    const float* dense, std::size_t dense_w_block,
                                    int64_t batch) const {
  if (dense_dim_ == 0) return;
  device::parallel_for(stream, static_cast<std::size_t>(dense_dim_),
                       DenseWeightGrad{dx0_.data(), dense, params.grads(dense_w_block), batch,
                                       FefmShape{slots_, dense_dim_, width_, dnn_ld_}});
}

}  // namespace gpubox::trainer
