// BatchNorm (batch_norm.hpp): the column statistics and sums (one work item per column), and the
// elementwise normalisation and input gradient (one item per value).
#include <string>
#include <type_traits>

#include "common/error.hpp"
#include "heterps/device/isa_clones.cuh"
#include "heterps/device/parallel_for.cuh"
#include "trainer/nn/batch_norm.hpp"
#include "trainer/nn/bf16.hpp"
#include "trainer/nn/device_math.cuh"

namespace gpubox::trainer {
namespace {

#if !defined(GPUBOX_BACKEND_CUDA)
// Columns a cpu run_range form sums at once (rows outer, these columns inner: the loads of a row
// are contiguous and the additions vectorize).
constexpr std::size_t kColumnChunk = 32;
#endif

GPUBOX_HD GPUBOX_FORCEINLINE float inv_std(float var, float epsilon) {
  return 1.0f / detail::sqrt_f(var + epsilon);
}

// The per-column coefficients the elementwise passes read (BatchNorm::coef_, [3 x cols]):
// y = (x - mean) a + beta with a = gamma / sqrt(var + eps) (the batch's statistics in training,
// the running ones in inference: x = mean gives beta exactly); dx = a dy + p (x - mean) + r with
// p = -a / sqrt(var + eps) d gamma / B and r = -a d beta / B (batch_norm.hpp's dx, expanded).
struct Coefficients {
  float* data;
  int cols;
  GPUBOX_HD float* scale() const { return data; }
  GPUBOX_HD float* x_term() const { return data + cols; }
  GPUBOX_HD float* constant() const { return data + 2 * cols; }
  // a of column j from its variance. A running variance below 0 (no batch's is: the PS async
  // mode's moves, averaged from stale bases, can pass a target near 0 by a sliver) counts as
  // 0, not as a NaN.
  GPUBOX_HD void set_scale(std::size_t j, float var, float gamma, float epsilon) const {
    scale()[j] = gamma * inv_std(var > 0.0f ? var : 0.0f, epsilon);
  }
};

// Item j: the batch's mean and (biased) variance of column j, summed in double over the rows in
// order (two passes: the variance from the centred values), and its scale a. The staged form
// (below) reads each chunk of rows once (moments) and combines the chunks.
template <class T>
struct ColumnStats {
  const T* x;
  int64_t ld;
  int64_t rows;
  float* mean;
  float* var;
  const float* gamma;
  float epsilon;
  Coefficients coef;
  GPUBOX_HD void finish(std::size_t j, double sum, double squares) const {
    mean[j] = rows > 0 ? static_cast<float>(sum / static_cast<double>(rows)) : 0.0f;
    var[j] = rows > 0 ? static_cast<float>(squares / static_cast<double>(rows)) : 0.0f;
    coef.set_scale(j, var[j], gamma[j], epsilon);
  }
  GPUBOX_HD double mean_of(double sum) const {
    return rows > 0 ? sum / static_cast<double>(rows) : 0.0;
  }
  // Rows [begin, end) of column j: their sum, and their squared distances from mu.
  GPUBOX_HD double sum_rows(std::size_t j, int64_t begin, int64_t end) const {
    double sum = 0.0;
    for (int64_t i = begin; i < end; ++i) sum += to_float(x[i * ld + j]);
    return sum;
  }
  GPUBOX_HD double square_rows(std::size_t j, int64_t begin, int64_t end, double mu) const {
    double squares = 0.0;
    for (int64_t i = begin; i < end; ++i) {
      const double d = to_float(x[i * ld + j]) - mu;
      squares += d * d;
    }
    return squares;
  }
  // Rows [begin, end) of column j in one read (the staged sums' chunks): their sum, and their
  // squared distances from their own mean (M2) from the sums of d = x - x_begin and of d^2,
  // M2 = sum d^2 - (sum d)^2 / n: shifted by one of the rows' own values, the subtraction cancels
  // only as much as that value's distance from their mean, not the mean's size.
  GPUBOX_HD void moments(std::size_t j, int64_t begin, int64_t end, double* sum, double* m2) const {
    *sum = 0.0;
    *m2 = 0.0;
    if (begin >= end) return;
    const double shift = to_float(x[begin * ld + static_cast<int64_t>(j)]);
    double shifted = 0.0, squares = 0.0;
    for (int64_t i = begin; i < end; ++i) {
      const double d = to_float(x[i * ld + static_cast<int64_t>(j)]) - shift;
      shifted += d;
      squares += d * d;
    }
    const auto n = static_cast<double>(end - begin);
    *sum = shift * n + shifted;
    const double centred = squares - shifted * shifted / n;
    // Rounding never makes a sum of squares negative; a NaN row keeps its NaN (B = 1 as well).
    *m2 = centred < 0.0 ? 0.0 : centred;
  }
  GPUBOX_HD void operator()(std::size_t j) const {
    const double sum = sum_rows(j, 0, rows);
    finish(j, sum, square_rows(j, 0, rows, mean_of(sum)));
  }
#if !defined(GPUBOX_BACKEND_CUDA)
  void run_range(std::size_t begin, std::size_t end) const {
    for (std::size_t c0 = begin; c0 < end; c0 += kColumnChunk) {
      const std::size_t n = end - c0 < kColumnChunk ? end - c0 : kColumnChunk;
      double sum[kColumnChunk] = {}, squares[kColumnChunk] = {}, mu[kColumnChunk];
      for (int64_t i = 0; i < rows; ++i) {
        const T* row = x + i * ld + c0;
        for (std::size_t k = 0; k < n; ++k) sum[k] += to_float(row[k]);
      }
      for (std::size_t k = 0; k < n; ++k) mu[k] = rows > 0 ? sum[k] / static_cast<double>(rows) : 0;
      for (int64_t i = 0; i < rows; ++i) {
        const T* row = x + i * ld + c0;
        for (std::size_t k = 0; k < n; ++k) {
          const double d = to_float(row[k]) - mu[k];
          squares[k] += d * d;
        }
      }
      for (std::size_t k = 0; k < n; ++k) finish(c0 + k, sum[k], squares[k]);
    }
  }
#endif
};

// Item j: the scale a of column j from the running variance.
struct RunningScale {
  const float* running_var;
  const float* gamma;
  float epsilon;
  Coefficients coef;
  GPUBOX_HD void operator()(std::size_t j) const {
    coef.set_scale(j, running_var[j], gamma[j], epsilon);
  }
};

// Item (i, j): y = (x - mean_j) a_j + beta_j.
template <class T>
struct Normalize {
  const T* x;
  int64_t x_ld;
  T* y;
  int64_t y_ld;
  int cols;
  const float* mean;
  const float* scale;
  const float* beta;
  GPUBOX_HD void operator()(std::size_t item) const {
    const std::size_t i = item / static_cast<std::size_t>(cols);
    const std::size_t j = item % static_cast<std::size_t>(cols);
    store_as(y + i * y_ld + j, (to_float(x[i * x_ld + j]) - mean[j]) * scale[j] + beta[j]);
  }
#if !defined(GPUBOX_BACKEND_CUDA)
  void run_range(std::size_t begin, std::size_t end) const {
    device::for_row_segments(begin, end, cols, [&](int64_t i, int64_t j0, int64_t j1) {
      const T* __restrict in = x + i * x_ld;
      T* __restrict out = y + i * y_ld;
      const float* __restrict m = mean;
      const float* __restrict a = scale;
      const float* __restrict b = beta;
      for (int64_t j = j0; j < j1; ++j) store_as(out + j, (to_float(in[j]) - m[j]) * a[j] + b[j]);
    });
  }
#endif
};

// Item j: d beta_j = sum_i dy_ij and d gamma_j = sum_i dy_ij xhat_ij (double, rows in order), the
// input gradient's coefficients, and the running statistics' changes
// share * (1 - m) * (batch - running).
template <class T>
struct ColumnGrads {
  const T* x;
  int64_t x_ld;
  const T* dy;
  int64_t dy_ld;
  int64_t rows;
  const float* mean;
  const float* var;
  float epsilon;
  Coefficients coef;  // its scale() is the forward's a
  float* d_gamma;
  float* d_beta;
  const float* running_mean;
  const float* running_var;
  float* d_running_mean;
  float* d_running_var;
  float rate;  // share * (1 - momentum)
  // Rows [begin, end) of column j: the sums of dy and of dy xhat.
  GPUBOX_HD void sum_rows(std::size_t j, int64_t begin, int64_t end, double* sum_dy,
                          double* sum_dy_xhat) const {
    const float inv = inv_std(var[j], epsilon);
    double dy_sum = 0.0, dy_xhat_sum = 0.0;
    for (int64_t i = begin; i < end; ++i) {
      const float g = to_float(dy[i * dy_ld + j]);
      dy_sum += g;
      dy_xhat_sum += g * ((to_float(x[i * x_ld + j]) - mean[j]) * inv);
    }
    *sum_dy = dy_sum;
    *sum_dy_xhat = dy_xhat_sum;
  }
  GPUBOX_HD void operator()(std::size_t j) const {
    double sum_dy = 0.0, sum_dy_xhat = 0.0;
    sum_rows(j, 0, rows, &sum_dy, &sum_dy_xhat);
    finish(j, sum_dy, sum_dy_xhat);
  }
  GPUBOX_HD void finish(std::size_t j, double sum_dy, double sum_dy_xhat) const {
    const float dbeta = static_cast<float>(sum_dy), dgamma = static_cast<float>(sum_dy_xhat);
    d_beta[j] = dbeta;
    d_gamma[j] = dgamma;
    const float per_row = rows > 0 ? 1.0f / static_cast<float>(rows) : 0.0f;
    const float a = coef.scale()[j];
    coef.x_term()[j] = -a * inv_std(var[j], epsilon) * dgamma * per_row;
    coef.constant()[j] = -a * dbeta * per_row;
    d_running_mean[j] = rows > 0 ? rate * (mean[j] - running_mean[j]) : 0.0f;
    d_running_var[j] = rows > 0 ? rate * (var[j] - running_var[j]) : 0.0f;
  }
#if !defined(GPUBOX_BACKEND_CUDA)
  void run_range(std::size_t begin, std::size_t end) const {
    for (std::size_t c0 = begin; c0 < end; c0 += kColumnChunk) {
      const std::size_t n = end - c0 < kColumnChunk ? end - c0 : kColumnChunk;
      double sum_dy[kColumnChunk] = {}, sum_dy_xhat[kColumnChunk] = {};
      float inv[kColumnChunk];
      for (std::size_t k = 0; k < n; ++k) inv[k] = inv_std(var[c0 + k], epsilon);
      for (int64_t i = 0; i < rows; ++i) {
        const T* x_row = x + i * x_ld + c0;
        const T* dy_row = dy + i * dy_ld + c0;
        for (std::size_t k = 0; k < n; ++k) {
          const float g = to_float(dy_row[k]);
          sum_dy[k] += g;
          sum_dy_xhat[k] += g * ((to_float(x_row[k]) - mean[c0 + k]) * inv[k]);
        }
      }
      for (std::size_t k = 0; k < n; ++k) finish(c0 + k, sum_dy[k], sum_dy_xhat[k]);
    }
  }
#endif
};

// Item (i, j): dx = a_j dy + p_j (x - mean_j) + r_j, 0 where a ReLU's output x is 0.
template <class T>
struct InputGrad {
  const T* x;
  int64_t x_ld;
  const T* dy;
  T* dx;
  int64_t grad_ld;
  int cols;
  const float* mean;
  Coefficients coef;
  bool input_is_relu;
  GPUBOX_HD float at(const T* x_row, const T* dy_row, int64_t j) const {
    const float x_ij = to_float(x_row[j]);
    const float d = coef.scale()[j] * to_float(dy_row[j]) + coef.x_term()[j] * (x_ij - mean[j]) +
                    coef.constant()[j];
    return input_is_relu && !(x_ij > 0.0f) ? 0.0f : d;
  }
  GPUBOX_HD void operator()(std::size_t item) const {
    const auto i = static_cast<int64_t>(item / static_cast<std::size_t>(cols));
    const auto j = static_cast<int64_t>(item % static_cast<std::size_t>(cols));
    store_as(dx + i * grad_ld + j, at(x + i * x_ld, dy + i * grad_ld, j));
  }
#if !defined(GPUBOX_BACKEND_CUDA)
  void run_range(std::size_t begin, std::size_t end) const {
    device::for_row_segments(begin, end, cols, [&](int64_t i, int64_t j0, int64_t j1) {
      const T* __restrict x_row = x + i * x_ld;
      const T* __restrict dy_row = dy + i * grad_ld;
      T* __restrict out = dx + i * grad_ld;
      for (int64_t j = j0; j < j1; ++j) store_as(out + j, at(x_row, dy_row, j));
    });
  }
#endif
};

// The staged column sums (BatchNormSpec::staged_column_sums): the rows of a batch of B in
// kRowChunks chunks of ceil(B / kRowChunks) rows (the last ones short or empty); one item per
// (chunk, column) reads its chunk's rows once, in order, into a [kRowChunks x cols] double
// buffer each (a warp reads a row's adjacent columns), then one item per column combines its
// chunks in chunk order. Every sum is then in one fixed order for a given B (deterministic), and
// B x cols values are read once, by kRowChunks x cols items, rather than walked by cols items one
// row after another.
constexpr int64_t kRowChunks = 64;

// Rows per chunk for a batch of `rows`: chunk c holds rows [c per, min((c + 1) per, rows)).
GPUBOX_HD GPUBOX_FORCEINLINE int64_t chunk_rows(int64_t rows) {
  return (rows + kRowChunks - 1) / kRowChunks;
}

// The sum of column j's chunks, in chunk order.
GPUBOX_HD GPUBOX_FORCEINLINE double add_chunks(const double* partial, int cols, std::size_t j) {
  double sum = 0.0;
  for (int64_t c = 0; c < kRowChunks; ++c) sum += partial[c * cols + static_cast<int64_t>(j)];
  return sum;
}

// Item (c, j): `pass`(j, rows of chunk c, &first[c][j], &second[c][j]).
template <class Pass>
struct ChunkPass {
  Pass pass;
  int cols;
  int64_t rows;
  double* first;   // [kRowChunks x cols]
  double* second;  // [kRowChunks x cols]
  GPUBOX_HD void operator()(std::size_t item) const {
    const auto c = static_cast<int64_t>(item / static_cast<std::size_t>(cols));
    const std::size_t j = item % static_cast<std::size_t>(cols);
    const int64_t per = chunk_rows(rows);
    const int64_t begin = c * per < rows ? c * per : rows;
    const int64_t end = begin + per < rows ? begin + per : rows;
    pass(j, begin, end, first + item, second + item);
  }
};

// ColumnStats' pass: a chunk's sum into `first`, its M2 into `second`.
template <class T>
struct ChunkMoments {
  ColumnStats<T> stats;
  GPUBOX_HD void operator()(std::size_t j, int64_t begin, int64_t end, double* sum,
                            double* m2) const {
    stats.moments(j, begin, end, sum, m2);
  }
};
// Item j: ColumnStats::finish from the chunks, combined in chunk order by Chan et al.'s
// pairwise update: the rows so far (n_a, their sum and M2) and chunk b give
// M2 = M2_a + M2_b + (mean_b - mean_a)^2 n_a n_b / (n_a + n_b). Each chunk is read once.
template <class T>
struct StatsFromChunks {
  ColumnStats<T> stats;
  const double* sums;
  const double* m2s;
  int cols;
  GPUBOX_HD void operator()(std::size_t j) const {
    const int64_t rows = stats.rows, per = chunk_rows(rows);
    double sum = 0.0, m2 = 0.0;
    for (int64_t c = 0; c * per < rows; ++c) {  // the non-empty chunks (none when rows = 0)
      const int64_t at = c * cols + static_cast<int64_t>(j);
      const auto n_a = static_cast<double>(c * per);
      const auto n_b = static_cast<double>(rows - c * per < per ? rows - c * per : per);
      // Chan's term delta^2 n_a n_b / (n_a + n_b), delta = s_b / n_b - s_a / n_a the chunk's
      // mean less the earlier rows', with one division: (s_b n_a - s_a n_b)^2 / (n_a n_b n).
      const double apart = sums[at] * n_a - sum * n_b;
      m2 += m2s[at] + (c == 0 ? 0.0 : apart * apart / (n_a * n_b * (n_a + n_b)));
      sum += sums[at];
    }
    stats.finish(j, sum, m2);
  }
};

// ColumnGrads' pass (both sums at once) and its item j from the chunks.
template <class T>
struct GradSums {
  ColumnGrads<T> grads;
  GPUBOX_HD void operator()(std::size_t j, int64_t begin, int64_t end, double* sum_dy,
                            double* sum_dy_xhat) const {
    grads.sum_rows(j, begin, end, sum_dy, sum_dy_xhat);
  }
};
template <class T>
struct GradsFromChunks {
  ColumnGrads<T> grads;
  const double* sum_dy;
  const double* sum_dy_xhat;
  int cols;
  GPUBOX_HD void operator()(std::size_t j) const {
    grads.finish(j, add_chunks(sum_dy, cols, j), add_chunks(sum_dy_xhat, cols, j));
  }
};

// Calls launch(p) with `data` typed as the element type (float, or Bf16).
template <class Launch>
void with_element(ElementType type, const void* data, Launch launch) {
  if (type == ElementType::kBf16) {
    launch(static_cast<const Bf16*>(data));
  } else {
    launch(static_cast<const float*>(data));
  }
}
}  // namespace

BatchNorm::BatchNorm(device::Card& card, DenseParameters& params, const BatchNormSpec& spec)
    : spec_(spec) {
  GPUBOX_EXPECTS(spec.cols > 0 && spec.x_ld >= spec.cols && spec.y_ld >= spec.cols &&
                     spec.grad_ld >= spec.cols,
                 "batch norm ", spec.name, ": ", spec.cols, " columns, strides ", spec.x_ld, ", ",
                 spec.y_ld, ", ", spec.grad_ld);
  GPUBOX_EXPECTS(spec.momentum >= 0.0f && spec.momentum < 1.0f && spec.epsilon > 0.0f,
                 "batch norm ", spec.name, ": momentum must be in [0, 1) and epsilon > 0, got ",
                 spec.momentum, " and ", spec.epsilon);
  const auto cols = static_cast<std::size_t>(spec.cols);
  gamma_ = params.add(spec.name + ".gamma", cols, ParamInit::kOne);
  beta_ = params.add(spec.name + ".beta", cols, ParamInit::kZero);
  running_mean_ = params.add_statistic(spec.name + ".running_mean", cols, ParamInit::kZero);
  running_var_ = params.add_statistic(spec.name + ".running_var", cols, ParamInit::kOne);
  mean_ = card.make_buffer<float>(cols);
  var_ = card.make_buffer<float>(cols);
  coef_ = card.make_buffer<float>(3 * cols);
  // Made once: a step allocates nothing (issue 31).
  if (spec.staged_column_sums)
    partial_ = card.make_buffer<double>(static_cast<std::size_t>(2 * kRowChunks) * cols);
}

std::string BatchNorm::describe() const {
  return spec_.name + " " + std::to_string(spec_.cols) + ": batch norm, parallel_for (" +
         element_type_name(spec_.type) + " rows, fp32 statistics, double column sums" +
         (spec_.staged_column_sums ? " in " + std::to_string(kRowChunks) + " row chunks" : "") +
         ")";
}

void BatchNorm::forward_train(const device::Stream& stream, const DenseParameters& params,
                              const void* x, void* y, int64_t batch) {
  const auto cols = static_cast<std::size_t>(spec_.cols);
  with_element(spec_.type, x, [&](const auto* in) {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(in)>>;
    const ColumnStats<T> stats{in,
                               spec_.x_ld,
                               batch,
                               mean_.data(),
                               var_.data(),
                               params.values(gamma_),
                               spec_.epsilon,
                               Coefficients{coef_.data(), spec_.cols}};
    if (spec_.staged_column_sums) {
      // Two launches (the chunks' moments, then their combination), x read once.
      double* sums = partial_.data();
      double* m2s = sums + kRowChunks * spec_.cols;
      device::parallel_for(stream, static_cast<std::size_t>(kRowChunks) * cols,
                           ChunkPass<ChunkMoments<T>>{{stats}, spec_.cols, batch, sums, m2s});
      device::parallel_for(stream, cols, StatsFromChunks<T>{stats, sums, m2s, spec_.cols});
    } else {
      device::parallel_for(stream, cols, device::isa_clones(stats));
    }
    normalize(stream, params, in, mean_.data(), y, batch);
  });
}

void BatchNorm::forward_infer(const device::Stream& stream, const DenseParameters& params,
                              const void* x, void* y, int64_t batch) {
  device::parallel_for(stream, static_cast<std::size_t>(spec_.cols),
                       RunningScale{params.values(running_var_), params.values(gamma_),
                                    spec_.epsilon, Coefficients{coef_.data(), spec_.cols}});
  with_element(spec_.type, x, [&](const auto* in) {
    normalize(stream, params, in, params.values(running_mean_), y, batch);
  });
}

template <class T>
void BatchNorm::normalize(const device::Stream& stream, const DenseParameters& params, const T* x,
                          const float* mean, void* y, int64_t batch) {
  device::parallel_for(
      stream, static_cast<std::size_t>(batch) * static_cast<std::size_t>(spec_.cols),
      Normalize<T>{x, spec_.x_ld, static_cast<T*>(y), spec_.y_ld, spec_.cols, mean,
                   Coefficients{coef_.data(), spec_.cols}.scale(), params.values(beta_)});
}

void BatchNorm::backward(const device::Stream& stream, DenseParameters& params, const void* x,
                         const void* dy, void* dx, int64_t batch, float share) {
  const auto cols = static_cast<std::size_t>(spec_.cols);
  with_element(spec_.type, x, [&](const auto* in) {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(in)>>;
    const T* d_out = static_cast<const T*>(dy);
    const ColumnGrads<T> grads{in,
                               spec_.x_ld,
                               d_out,
                               spec_.grad_ld,
                               batch,
                               mean_.data(),
                               var_.data(),
                               spec_.epsilon,
                               Coefficients{coef_.data(), spec_.cols},
                               params.grads(gamma_),
                               params.grads(beta_),
                               params.values(running_mean_),
                               params.values(running_var_),
                               params.grads(running_mean_),
                               params.grads(running_var_),
                               share * (1.0f - spec_.momentum)};
    if (spec_.staged_column_sums) {
      double* sum_dy = partial_.data();
      double* sum_dy_xhat = sum_dy + kRowChunks * spec_.cols;
      device::parallel_for(stream, static_cast<std::size_t>(kRowChunks) * cols,
                           ChunkPass<GradSums<T>>{{grads}, spec_.cols, batch, sum_dy, sum_dy_xhat});
      device::parallel_for(stream, cols,
                           GradsFromChunks<T>{grads, sum_dy, sum_dy_xhat, spec_.cols});
    } else {
      device::parallel_for(stream, cols, device::isa_clones(grads));
    }
    device::parallel_for(
        stream, static_cast<std::size_t>(batch) * cols,
        InputGrad<T>{in, spec_.x_ld, d_out, static_cast<T*>(dx), spec_.grad_ld, spec_.cols,
                     mean_.data(), Coefficients{coef_.data(), spec_.cols}, spec_.input_is_relu});
  });
}

}  // namespace gpubox::trainer
