// deepfm's pairwise interaction term (FmPart, layers.hpp). Portable: one parallel_for thread per
// instance, reading the pooled embeddings from the first layer's input rows (fp32 or bf16).
#include <algorithm>
#include <type_traits>

#include "common/error.hpp"
#include "heterps/device/parallel_for.cuh"
#include "trainer/nn/bf16.hpp"
#include "trainer/nn/layers.hpp"

namespace gpubox::trainer {
namespace {
// Where slot s's embedding v_s sits in an instance's row: columns embedx_column + s * width
// + [0, mf_dim).
struct FmShape {
  int slots;
  int width;
  int embedx_column;
  int mf_dim;
};

#if !defined(GPUBOX_BACKEND_CUDA)
// cpu: the embedx columns a run_range pass holds at once.
constexpr int kFmColumnBlock = 8;

// Calls block(k0, count) for the column blocks of [0, mf_dim) in order: `count` is a compile-time
// kFmColumnBlock for the full blocks (their sums and squares then stay in registers rather than
// on the stack, where each slot's add waited on a store) and an int for a last partial one.
template <class Block>
GPUBOX_FORCEINLINE void for_column_blocks(int mf_dim, const Block& block) {
  int k0 = 0;
  for (; k0 + kFmColumnBlock <= mf_dim; k0 += kFmColumnBlock) {
    block(k0, std::integral_constant<int, kFmColumnBlock>{});
  }
  if (k0 < mf_dim) block(k0, mf_dim - k0);
}

// sum[c] = sum_s v_s(k0 + c) and, with squares, squares[c] = sum_s v_s(k0 + c)^2 for
// c < count, slots in order as the per-instance loops add them (bit-equal), walked slot by slot
// so that the inner loop over contiguous columns vectorizes. The squares take a walk of their
// own (the block's values are in L1 by then): in one walk g++ kept the 16 accumulators of a
// full block in scalar registers and on the stack.
template <class T, class Count>
GPUBOX_FORCEINLINE void fm_column_sums(const T* row, const FmShape& shape, int k0, Count count,
                                       float* sum, float* squares) {
  std::fill(sum, sum + count, 0.0f);
  for (int s = 0; s < shape.slots; ++s) {
    const T* __restrict v = row + s * shape.width + k0;
    for (int c = 0; c < count; ++c) sum[c] += to_float(v[c]);
  }
  if (squares == nullptr) return;
  std::fill(squares, squares + count, 0.0f);
  for (int s = 0; s < shape.slots; ++s) {
    const T* __restrict v = row + s * shape.width + k0;
    for (int c = 0; c < count; ++c) squares[c] += to_float(v[c]) * to_float(v[c]);
  }
}
#endif

// logits[i] += 1/2 sum_k [(sum_s v_sk)^2 - sum_s v_sk^2] = sum_{s<t} <v_s, v_t>.
template <class T>
struct FmForward {
  const T* rows;
  int64_t ld;
  float* logits;
  FmShape shape;
  GPUBOX_HD void operator()(std::size_t i) const {
    const T* row = rows + static_cast<int64_t>(i) * ld + shape.embedx_column;
    float pairs = 0.0f;
    for (int k = 0; k < shape.mf_dim; ++k) {
      float sum = 0.0f, squares = 0.0f;
      for (int s = 0; s < shape.slots; ++s) {
        const float v = to_float(row[s * shape.width + k]);
        sum += v;
        squares += v * v;
      }
      pairs += sum * sum - squares;
    }
    logits[i] += 0.5f * pairs;
  }
#if !defined(GPUBOX_BACKEND_CUDA)
  void run_range(std::size_t begin, std::size_t end) const {
    for (std::size_t i = begin; i < end; ++i) {
      const T* row = rows + static_cast<int64_t>(i) * ld + shape.embedx_column;
      float pairs = 0.0f;
      for_column_blocks(shape.mf_dim, [&](int k0, auto count) {
        float sum[kFmColumnBlock], squares[kFmColumnBlock];
        fm_column_sums(row, shape, k0, count, sum, squares);
        for (int c = 0; c < count; ++c) pairs += sum[c] * sum[c] - squares[c];
      });
      logits[i] += 0.5f * pairs;
    }
  }
#endif
};

// d fm_i / d v_sk = sum_t v_tk - v_sk; times dlogits[i], added to the pooled gradient.
template <class T>
struct FmBackward {
  const T* rows;
  int64_t ld;
  const float* dlogits;
  float* d_pooled;
  int64_t d_ld;
  FmShape shape;
  GPUBOX_HD void operator()(std::size_t i) const {
    const T* row = rows + static_cast<int64_t>(i) * ld + shape.embedx_column;
    float* d_row = d_pooled + static_cast<int64_t>(i) * d_ld + shape.embedx_column;
    const float g = dlogits[i];
    for (int k = 0; k < shape.mf_dim; ++k) {
      float sum = 0.0f;
      for (int s = 0; s < shape.slots; ++s) sum += to_float(row[s * shape.width + k]);
      for (int s = 0; s < shape.slots; ++s) {
        d_row[s * shape.width + k] += g * (sum - to_float(row[s * shape.width + k]));
      }
    }
  }
#if !defined(GPUBOX_BACKEND_CUDA)
  void run_range(std::size_t begin, std::size_t end) const {
    for (std::size_t i = begin; i < end; ++i) {
      const T* row = rows + static_cast<int64_t>(i) * ld + shape.embedx_column;
      float* d_row = d_pooled + static_cast<int64_t>(i) * d_ld + shape.embedx_column;
      const float g = dlogits[i];
      for_column_blocks(shape.mf_dim, [&](int k0, auto count) {
        float sum[kFmColumnBlock];
        fm_column_sums(row, shape, k0, count, sum, static_cast<float*>(nullptr));
        for (int s = 0; s < shape.slots; ++s) {
          const T* __restrict v = row + s * shape.width + k0;
          float* __restrict d = d_row + s * shape.width + k0;
          for (int c = 0; c < count; ++c) d[c] += g * (sum[c] - to_float(v[c]));
        }
      });
    }
  }
#endif
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

FmPart::FmPart(const SlotSumPool& pool)
    : slots_(pool.slots()),
      width_(pool.width()),
      embedx_column_(pool.embed_w_column() + 1),
      mf_dim_(pool.mf_dim()) {
  GPUBOX_EXPECTS(
      pool.uniform(),
      "the pairwise FM interaction (deepfm, fm) needs every slot at one embedx width, but "
      "hyper_parameters.slot_dims gives the slots different widths (slot 0: ",
      pool.slot_mf_dim(0), ", the widest: ", pool.mf_dim(),
      "); set them equal, or train dnn, wide_deep or dcn_v2");
}

void FmPart::forward(const device::Stream& stream, const InputRows& input, int64_t batch,
                     float* logits) const {
  const FmShape shape{slots_, width_, embedx_column_, mf_dim_};
  with_row_type(input, [&](const auto* rows) {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(rows)>>;
    device::parallel_for(stream, static_cast<std::size_t>(batch),
                         FmForward<T>{rows, input.ld, logits, shape});
  });
}

void FmPart::backward(const device::Stream& stream, const InputRows& input, const float* dlogits,
                      int64_t batch, float* d_pooled, int64_t d_ld) const {
  const FmShape shape{slots_, width_, embedx_column_, mf_dim_};
  with_row_type(input, [&](const auto* rows) {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(rows)>>;
    device::parallel_for(stream, static_cast<std::size_t>(batch),
                         FmBackward<T>{rows, input.ld, dlogits, d_pooled, d_ld, shape});
  });
}

}  // namespace gpubox::trainer
