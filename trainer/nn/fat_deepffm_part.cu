// fat_deepffm's CEN attention and field-aware pairs (FatDeepffmPart, fat_deepffm_part.hpp): its
// blocks, buffers, forward and backward. Portable: GEMMs and GEMVs through Blas for the sums
// across instances or cells, parallel_for over items of one instance that each own the values
// they write (no atomics; sums in a fixed order, runs deterministic).
//
// Backward, with s = the dense scale, g = dlogits, dH = scale * dL/dH (from the DNN):
//   dO[i, j][e] = s g + (i != j ? dH[pair(i, j)][e] O[j, i][e] : 0)
//   da[i*N+j]   = sum_e dO[i, j][e] F[i, j][e], masked by a > 0 (fc_1's ReLU) -> fc_1, fc_0
//   dF[i, j][e] = dO[i, j][e] a[i*N+j] + (e == argmax ? dp[i*N+j] : 0)
//   dE[d, j, e] = sum_b dF[S+d, j][e] x_d    (partial sums over chunks of the batch, then a GEMV)
#include <algorithm>
#include <cmath>
#include <sstream>
#include <vector>

#include "common/error.hpp"
#include "heterps/device/parallel_for.cuh"
#include "trainer/nn/activation_layout.hpp"
#include "trainer/nn/fat_deepffm_part.hpp"

namespace gpubox::trainer {
namespace {
std::size_t items(int64_t a, int64_t b) { return static_cast<std::size_t>(a * b); }

// N^2 after the checks every shape below relies on.
int checked_cells(const SlotSumPool& pool, const DenseModelConfig& config) {
  const int fields = pool.slots() + config.dense_dim;
  GPUBOX_EXPECTS(pool.uniform(),
                 "fat_deepffm gives every field's factor one width, but "
                 "hyper_parameters.slot_dims gives the slots different widths; leave slot_dims "
                 "empty");
  GPUBOX_EXPECTS(config.dense_dim >= 0 && fields >= 2, "fat_deepffm pairs fields, but the sparse ",
                 "slots (", pool.slots(), ") and hyper_parameters.dense_input_dim (",
                 config.dense_dim, ") make ", fields);
  GPUBOX_EXPECTS(pool.mf_dim() > 0 && pool.mf_dim() % fields == 0,
                 "fat_deepffm's rows hold one factor per field: their embedx width (",
                 pool.mf_dim(), ") must be a multiple of the fields (", pool.slots(),
                 " sparse slots + ", config.dense_dim, " dense features = ", fields,
                 "); the config loader sets it from hyper_parameters.sparse_feature_dim");
  return fields * fields;
}

LinearGemmSpec cen_spec(const char* name, int cells, bool input_is_relu) {
  LinearGemmSpec spec;
  spec.name = name;
  spec.in = cells;
  spec.out = cells;
  spec.relu = true;
  spec.input_is_relu = input_is_relu;
  spec.dx_cols = cells;
  spec.x_ld = spec.y_ld = spec.dz_ld = spec.dx_ld = activation_ld(cells);
  return spec;
}

// The shape every functor reads. Pairs are numbered in itertools.combinations order.
struct FatShape {
  int slots;
  int dense_dim;
  int k;
  int64_t cen_ld;  // of p, a and their gradients
  int64_t dnn_ld;  // of the DNN input and its gradient
  GPUBOX_HD int fields() const { return slots + dense_dim; }
  GPUBOX_HD int cells() const { return fields() * fields(); }
  GPUBOX_HD int pairs() const { return fields() * (fields() - 1) / 2; }
  GPUBOX_HD int pair(int a, int b) const { return a * (2 * fields() - a - 1) / 2 + (b - a - 1); }
  // F[b, cell][e]'s index in feat.
  GPUBOX_HD int64_t feat(int64_t b, int cell, int e) const {
    return (b * cells() + cell) * static_cast<int64_t>(k) + e;
  }
};

// Item (b, i): F[i, j] for every j, their max pool and argmax, and with cvm slot i's show/click
// columns of the DNN input.
struct BuildFields {
  const float* pooled_rows;
  int64_t rows_ld;
  const float* dense;
  const float* dense_w;
  float* feat;
  int32_t* argmax;
  float* pool;
  float* dnn_x;
  FatShape shape;
  bool use_cvm;
  int slot_width;
  int embedx_column;
  GPUBOX_HD void operator()(std::size_t item) const {
    const int nf = shape.fields(), k = shape.k;
    const auto b = static_cast<int64_t>(item / static_cast<std::size_t>(nf));
    const int i = static_cast<int>(item % static_cast<std::size_t>(nf));
    const float* block = pooled_rows + b * rows_ld + static_cast<int64_t>(i) * slot_width;
    const float x = i < shape.slots ? 0.0f : dense[b * shape.dense_dim + (i - shape.slots)];
    for (int j = 0; j < nf; ++j) {
      const int cell = i * nf + j;
      float* v = feat + shape.feat(b, cell, 0);
      for (int e = 0; e < k; ++e) {
        v[e] = i < shape.slots
                   ? block[embedx_column + j * k + e]
                   : x * dense_w[(static_cast<int64_t>(i - shape.slots) * nf + j) * k + e];
      }
      int best = 0;
      for (int e = 1; e < k; ++e) best = v[e] > v[best] ? e : best;
      argmax[b * shape.cells() + cell] = best;
      pool[b * shape.cen_ld + cell] = v[best];
    }
    if (use_cvm && i < shape.slots) {
      float* cvm = dnn_x + b * shape.dnn_ld + shape.pairs() * static_cast<int64_t>(k);
      cvm[2 * i] = block[0];
      cvm[2 * i + 1] = block[1];
    }
  }
};

// Item (b, i): H[pair(i, j)] = O[i, j] * O[j, i] for every j > i, and the first-order term's
// cells of row i: first[b, i*N+j] = a[i*N+j] sum_e F[i, j][e] for every j (add_logits sums them).
struct PairForward {
  const float* feat;
  const float* attn;
  float* dnn_x;
  float* first;
  FatShape shape;
  GPUBOX_HD void operator()(std::size_t item) const {
    const int nf = shape.fields(), k = shape.k;
    const auto b = static_cast<int64_t>(item / static_cast<std::size_t>(nf));
    const int i = static_cast<int>(item % static_cast<std::size_t>(nf));
    const float* a = attn + b * shape.cen_ld;
    for (int j = 0; j < nf; ++j) {
      const float* fij = feat + shape.feat(b, i * nf + j, 0);
      float s = 0.0f;
      for (int e = 0; e < k; ++e) s += fij[e];
      first[b * shape.cen_ld + i * nf + j] = a[i * nf + j] * s;
      if (j <= i) continue;
      const float aij = a[i * nf + j], aji = a[j * nf + i];
      const float* fji = feat + shape.feat(b, j * nf + i, 0);
      float* h = dnn_x + b * shape.dnn_ld + static_cast<int64_t>(shape.pair(i, j)) * k;
      for (int e = 0; e < k; ++e) h[e] = (aij * fij[e]) * (aji * fji[e]);
    }
  }
};

// dO[b, cell][e] (see the file comment), from the scaled DNN input gradient.
struct OutputGrad {
  const float* feat;
  const float* attn;
  const float* dnn_dx;
  const float* dlogits;
  float scale;
  FatShape shape;
  GPUBOX_HD float operator()(int64_t b, int i, int j, int e) const {
    const float first = scale * dlogits[b];
    if (i == j) return first;
    const int nf = shape.fields();
    const int p = i < j ? shape.pair(i, j) : shape.pair(j, i);
    const float o_ji = attn[b * shape.cen_ld + j * nf + i] * feat[shape.feat(b, j * nf + i, e)];
    return first + dnn_dx[b * shape.dnn_ld + static_cast<int64_t>(p) * shape.k + e] * o_ji;
  }
};

// Item (b, cell): d_attn = (sum_e dO F) masked by fc_1's ReLU (a > 0).
struct AttentionGrad {
  OutputGrad d_out;
  float* d_attn;
  GPUBOX_HD void operator()(std::size_t item) const {
    const FatShape& shape = d_out.shape;
    const int nf = shape.fields();
    const auto b = static_cast<int64_t>(item / static_cast<std::size_t>(shape.cells()));
    const int cell = static_cast<int>(item % static_cast<std::size_t>(shape.cells()));
    float* out = d_attn + b * shape.cen_ld + cell;
    if (d_out.attn[b * shape.cen_ld + cell] <= 0.0f) {
      *out = 0.0f;
      return;
    }
    float sum = 0.0f;
    for (int e = 0; e < shape.k; ++e) {
      sum += d_out(b, cell / nf, cell % nf, e) * d_out.feat[shape.feat(b, cell, e)];
    }
    *out = sum;
  }
};

// dF[b, cell][e] (scaled; see the file comment).
struct FieldGrad {
  OutputGrad d_out;
  const int32_t* argmax;
  const float* d_pool;
  GPUBOX_HD float operator()(int64_t b, int cell, int e) const {
    const FatShape& shape = d_out.shape;
    const int nf = shape.fields();
    float g = d_out(b, cell / nf, cell % nf, e) * d_out.attn[b * shape.cen_ld + cell];
    if (argmax[b * shape.cells() + cell] == e) g += d_pool[b * shape.cen_ld + cell];
    return g;
  }
};

// d_pooled[b, c] = unscale * dF at slot c / slot_width's embedx column, 0 elsewhere.
struct ScatterPooledGrad {
  FieldGrad d_field;
  float* d_pooled;
  int pooled_cols;
  int slot_width;
  int embedx_column;
  float unscale;
  GPUBOX_HD void operator()(std::size_t item) const {
    const FatShape& shape = d_field.d_out.shape;
    const auto b = static_cast<int64_t>(item / static_cast<std::size_t>(pooled_cols));
    const int c = static_cast<int>(item % static_cast<std::size_t>(pooled_cols));
    const int s = c / slot_width, col = c % slot_width - embedx_column;
    const int j = col / shape.k, e = col % shape.k;
    d_pooled[item] = col >= 0 ? unscale * d_field(b, s * shape.fields() + j, e) : 0.0f;
  }
};

// Item (c, col), col = (d N + j) k + e: partials[c, col] = sum over chunk c's instances b, in
// order, of x_bd dF[b, S+d, j][e]. dE[d, j, e] is the sum of column col over the chunks (a GEMV):
// the dense fields' dF is never stored, and no item loops over more than one chunk.
struct DenseWeightPartials {
  FieldGrad d_field;
  const float* dense;
  float* partials;  // [chunks x D N k]
  int64_t batch;
  int64_t chunk_rows;
  GPUBOX_HD void operator()(std::size_t item) const {
    const FatShape& shape = d_field.d_out.shape;
    const int nk = shape.fields() * shape.k;
    const auto row = static_cast<std::size_t>(shape.dense_dim) * nk;
    const auto chunk = static_cast<int64_t>(item / row);
    const int col = static_cast<int>(item % row);
    const int d = col / nk;
    const int cell = shape.slots * shape.fields() + col / shape.k, e = col % shape.k;
    const int64_t first = chunk * chunk_rows;
    const int64_t end = first + chunk_rows < batch ? first + chunk_rows : batch;
    float sum = 0.0f;
    for (int64_t b = first; b < end; ++b)
      sum += dense[b * shape.dense_dim + d] * d_field(b, cell, e);
    partials[item] = sum;
  }
};

}  // namespace

FatDeepffmPart::FatDeepffmPart(device::Card& card, DenseParameters& params, Blas& blas,
                               const SlotSumPool& pool, const DenseModelConfig& config)
    : slots_(pool.slots()),
      dense_dim_(config.dense_dim),
      blas_(&blas),
      use_cvm_(pool.use_cvm()),
      slot_width_(pool.width()),
      embedx_column_(pool.embed_w_column() + 1),
      cen_ld_(activation_ld(checked_cells(pool, config))),
      dnn_ld_(0),
      fc0_(params, blas, cen_spec("cen.fc_0", checked_cells(pool, config), false)),
      fc1_(params, blas, cen_spec("cen.fc_1", checked_cells(pool, config), true)) {
  k_ = pool.mf_dim() / fields();
  dnn_ld_ = activation_ld(dnn_in());
  if (dense_dim_ > 0) {
    // PaddleRec's dense_w: Constant(1.0), [1 x D x N k].
    dense_w_ =
        params.add("fat_deepffm.dense_w", static_cast<std::size_t>(dense_dim_) * fields() * k_,
                   ParamInit::kOne, 0.0f);
  }
  for (auto* buffer : {&feat_, &pooled_, &hidden_, &attn_, &first_, &dnn_x_, &dnn_dx_, &d_attn_,
                       &d_hidden_, &d_pool_, &dense_w_sums_}) {
    *buffer = card.make_buffer<float>(0);
  }
  argmax_ = card.make_buffer<int32_t>(0);
  // add_logits' GEMV sums a row's cells against it, dense_w's gradient its chunks' partial sums.
  const auto cells = static_cast<std::size_t>(fields()) * fields();
  ones_ = device::to_device(
      std::vector<float>(std::max(cells, static_cast<std::size_t>(kDenseWGradChunks)), 1.0f),
      card.memory(), card.stream());
  // Batch-independent: at most kDenseWGradChunks chunks whatever the batch.
  dense_w_sums_.resize_discard(static_cast<std::size_t>(kDenseWGradChunks) * dense_dim_ * fields() *
                               k_);
}

int64_t FatDeepffmPart::dense_w_chunk_rows(int64_t batch) {
  return std::max(kDenseWGradChunkRows, (batch + kDenseWGradChunks - 1) / kDenseWGradChunks);
}

double FatDeepffmPart::flops_per_example() const {
  const double cells = static_cast<double>(fields()) * fields();
  // CEN: two N^2 x N^2 layers, forward, weight and input gradients each.
  const double cen = 2.0 * 2.0 * cells * (3.0 * cells);
  // Elementwise by hand: the pool and y1 (2 per value), the pairs (3 per value), their backward
  // (about 8 per value).
  const double elementwise = cells * k_ * (2.0 + 2.0 + 8.0) + 3.0 * pairs() * k_;
  return cen + elementwise;
}

std::string FatDeepffmPart::kernel_report(int64_t batch) const {
  std::ostringstream out;
  out << "\n  cen " << fields() << " x " << fields() << " fields x " << k_ << ": " << fc0_.in()
      << "x" << fc0_.out() << " " << fc0_.describe(batch) << "; " << fc1_.in() << "x" << fc1_.out()
      << " " << fc1_.describe(batch) << "\n  field-aware pairs " << pairs() << " x " << k_
      << ": parallel_for over (instance, field) (fp32, batch " << batch
      << "); first-order term: sgemv";
  if (dense_dim_ > 0) {
    const int64_t rows = dense_w_chunk_rows(batch);
    out << "; dense_w's gradient: partial sums over " << (batch + rows - 1) / rows << " chunks of "
        << rows << " instances, then sgemv " << dense_dim_ * fields() * k_ << "x"
        << (batch + rows - 1) / rows;
  }
  return out.str();
}

void FatDeepffmPart::reserve(int64_t batch) {
  const auto n = static_cast<std::size_t>(batch);
  const std::size_t cells = static_cast<std::size_t>(fields()) * fields();
  feat_.resize_discard(n * cells * k_);
  argmax_.resize_discard(n * cells);
  for (auto* buffer : {&pooled_, &hidden_, &attn_, &first_, &d_attn_, &d_hidden_, &d_pool_}) {
    buffer->resize_discard(n * static_cast<std::size_t>(cen_ld_));
  }
  dnn_x_.resize_discard(n * static_cast<std::size_t>(dnn_ld_));
  dnn_dx_.resize_discard(n * static_cast<std::size_t>(dnn_ld_));
  fc0_.prepare(batch);
  fc1_.prepare(batch);
}

void FatDeepffmPart::forward(const device::Stream& stream, const DenseParameters& params,
                             const InputRows& x0, const float* dense, int64_t batch) {
  GPUBOX_EXPECTS(x0.type == ElementType::kF32, "fat_deepffm reads the pooled slots as fp32");
  const FatShape shape{slots_, dense_dim_, k_, cen_ld_, dnn_ld_};
  device::parallel_for(
      stream, items(batch, fields()),
      BuildFields{static_cast<const float*>(x0.data), x0.ld, dense,
                  dense_dim_ > 0 ? params.values(dense_w_) : nullptr, feat_.data(), argmax_.data(),
                  pooled_.data(), dnn_x_.data(), shape, use_cvm_, slot_width_, embedx_column_});
  fc0_.forward(params, pooled_.data(), hidden_.data(), batch);
  fc1_.forward(params, hidden_.data(), attn_.data(), batch);
  device::parallel_for(
      stream, items(batch, fields()),
      PairForward{feat_.data(), attn_.data(), dnn_x_.data(), first_.data(), shape});
}

void FatDeepffmPart::add_logits(const device::Stream& stream, int64_t batch, float* logits) const {
  GPUBOX_EXPECTS(&stream == &blas_->stream(), "fat_deepffm's add_logits runs on its card's stream");
  // logits += first 1: each row's cells summed (forward's PairForward wrote a F's sums there).
  blas_->sgemv(Transpose::kNo, batch, fields() * fields(), 1.0f, first_.data(), cen_ld_,
               ones_.data(), 1.0f, logits);
}

void FatDeepffmPart::backward(const device::Stream& stream, DenseParameters& params,
                              const float* dense, const float* dlogits, float scale, int64_t batch,
                              float unscale, float* d_pooled) {
  const FatShape shape{slots_, dense_dim_, k_, cen_ld_, dnn_ld_};
  const OutputGrad d_out{feat_.data(), attn_.data(), dnn_dx_.data(), dlogits, scale, shape};
  const int cells = fields() * fields();
  device::parallel_for(stream, items(batch, cells), AttentionGrad{d_out, d_attn_.data()});
  fc1_.backward_weights(params, hidden_.data(), d_attn_.data(), batch);
  fc1_.backward_data(params, d_attn_.data(), hidden_.data(), &fc0_, 1.0f, d_hidden_.data(), batch);
  fc0_.backward_weights(params, pooled_.data(), d_hidden_.data(), batch);
  fc0_.backward_data(params, d_hidden_.data(), pooled_.data(), nullptr, 1.0f, d_pool_.data(),
                     batch);
  const FieldGrad d_field{d_out, argmax_.data(), d_pool_.data()};
  const int pool_cols = slots_ * slot_width_;
  device::parallel_for(
      stream, items(batch, pool_cols),
      ScatterPooledGrad{d_field, d_pooled, pool_cols, slot_width_, embedx_column_, unscale});
  if (dense_dim_ > 0) {
    // dE[d] = sum_b x_bd dF_dense[b, d], in two launches whatever D and the batch: each chunk's
    // partial sums (dF computed where it is summed, never stored), then their sum as a GEMV
    // against ones (partials^T 1; a zero batch has no chunk and writes dE = 0).
    const int64_t row = int64_t{dense_dim_} * fields() * k_;
    const int64_t chunk_rows = dense_w_chunk_rows(batch);
    const int64_t chunks = (batch + chunk_rows - 1) / chunk_rows;
    device::parallel_for(
        stream, items(chunks, row),
        DenseWeightPartials{d_field, dense, dense_w_sums_.data(), batch, chunk_rows});
    blas_->sgemv(Transpose::kYes, chunks, row, 1.0f, dense_w_sums_.data(), row, ones_.data(), 0.0f,
                 params.grads(dense_w_));
  }
}

}  // namespace gpubox::trainer
