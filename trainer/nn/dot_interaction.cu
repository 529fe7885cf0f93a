// dlrm's pairwise dot interaction and the bottom MLP's input rows (DlrmPart, dlrm_part.hpp).
// Portable: parallel_for over (instance, feature) items; every item owns the values it writes,
// so no atomics. Dot products accumulate in fp32 whatever the rows' type.
#include <algorithm>
#include <cstring>
#include <type_traits>

#include "heterps/device/isa_clones.cuh"
#include "heterps/device/parallel_for.cuh"
#include "trainer/nn/bf16.hpp"
#include "trainer/nn/dlrm_part.hpp"

namespace gpubox::trainer {
namespace {

// Where the interaction's vectors sit: feature f < slots is slot f's embedding in the pooled rows
// (x0), feature `slots` the bottom MLP's output, R's first `width` columns.
template <class T>
struct InteractionShape {
  const T* x0;
  int64_t x0_ld;
  T* top;  // R
  int64_t top_ld;
  int slots;
  int slot_width;     // pooled columns per slot
  int vector_column;  // v_s's first column inside slot s's block
  int width;          // d
  bool use_cvm;

  GPUBOX_HD int features() const { return slots + 1; }
  GPUBOX_HD int pairs() const { return features() * (features() - 1) / 2; }
  GPUBOX_HD const T* vector(int64_t i, int f) const {
    return f < slots ? x0 + i * x0_ld + f * slot_width + vector_column : top + i * top_ld;
  }
  // Pair (a, b), a < b, in the row-major upper triangle of the F x F products.
  GPUBOX_HD int pair(int a, int b) const { return a * features() - a * (a + 1) / 2 + (b - a - 1); }
};

// <u, v> in fp32 over four interleaved partial sums (sum j takes the k = j mod 4 of the whole
// groups of four, in order of k), added pairwise, then the columns past them in order: an order
// fixed by the width alone, whatever the thread count, and one a compiler can keep in one SIMD
// register.
template <class T>
GPUBOX_HD float dot(const T* u, const T* v, int width) {
  float lane[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  int k = 0;
  for (; k + 4 <= width; k += 4) {
    for (int j = 0; j < 4; ++j) lane[j] += to_float(u[k + j]) * to_float(v[k + j]);
  }
  float sum = (lane[0] + lane[2]) + (lane[1] + lane[3]);
  for (; k < width; ++k) sum += to_float(u[k]) * to_float(v[k]);
  return sum;
}

#if !defined(GPUBOX_BACKEND_CUDA)
// The cpu backward's columns per block (dlrm's default width, 16), and the forward's pairs per
// block: one AVX-512 vector, four SSE ones. A GNU vector acts lane by lane, so each lane's sums
// are a scalar loop's.
constexpr int kBlockColumns = 16;
using BlockColumns = float __attribute__((vector_size(kBlockColumns * sizeof(float))));

// Columns [0, kBlockColumns) of `p` as floats (through a pointer: a 64-byte vector passed by
// value has an ABI of its own per instruction set).
GPUBOX_FORCEINLINE void load_block(const float* p, BlockColumns* v) {
  std::memcpy(v, p, sizeof(BlockColumns));
}
GPUBOX_FORCEINLINE void load_block(const Bf16* p, BlockColumns* v) {
  for (int c = 0; c < kBlockColumns; ++c) (*v)[c] = to_float(p[c]);
}

// The forward's per-instance copy of the F vectors, column-major (column k's F values, then
// kBlockColumns zeros a block of pairs may read past the last feature), and its pairs' values
// (then a block's room: a block past the last feature is stored whole): up to these many floats
// on the stack; larger instances take the item-by-item form.
constexpr int kTransposedFloats = 8192;
constexpr int kPairFloats = 4096;
#endif

// Item (i, a): R[i, d + pair(a, b)] = <T_a, T_b> for b > a; slot a's cvm columns copied behind
// the pairs.
template <class T>
struct InteractionForward {
  InteractionShape<T> shape;
  GPUBOX_HD void operator()(std::size_t item) const {
    const int features = shape.features();
    const auto i = static_cast<int64_t>(item / static_cast<std::size_t>(features));
    const int a = static_cast<int>(item % static_cast<std::size_t>(features));
    T* out = shape.top + i * shape.top_ld + shape.width;
    const T* va = shape.vector(i, a);
    for (int b = a + 1, at = shape.pair(a, b); b < features; ++b, ++at) {
      store_as(out + at, dot(va, shape.vector(i, b), shape.width));
    }
    copy_cvm(i, a);
  }
#if !defined(GPUBOX_BACKEND_CUDA)
  // Items [begin, end) on the cpu (run through isa_clones): an instance's vectors copied once,
  // column-major, so that a block of kBlockColumns pairs (a, b..b+15) sums in register vectors,
  // lane by lane dot()'s additions in its order (four partial sums over k mod 4, added pairwise,
  // then the tail columns): the same bits as the item-by-item form, which the dot's 4 lanes
  // kept at a quarter of an AVX-512 vector.
  void run_range(std::size_t begin, std::size_t end) const {
    const int features = shape.features();
    const int ld = features + kBlockColumns;
    if (static_cast<int64_t>(shape.width) * ld > kTransposedFloats ||
        shape.pairs() + kBlockColumns > kPairFloats) {
      for (std::size_t item = begin; item < end; ++item) (*this)(item);
      return;
    }
    const auto per_instance = static_cast<std::size_t>(features);
    float columns[kTransposedFloats];
    float values[kPairFloats];
    // The padding past the features: zero once (each instance's copy writes the features only).
    for (int k = 0; k < shape.width; ++k) {
      std::fill(columns + k * ld + features, columns + (k + 1) * ld, 0.0f);
    }
    for (std::size_t item = begin; item < end;) {
      const auto i = static_cast<int64_t>(item / per_instance);
      const int a_begin = static_cast<int>(item % per_instance);
      const int a_end = static_cast<int>(std::min(per_instance, a_begin + (end - item)));
      for (int b = 0; b < features; ++b) {
        const T* v = shape.vector(i, b);
        for (int k = 0; k < shape.width; ++k) columns[k * ld + b] = to_float(v[k]);
      }
      // In order of a, so a block stored past a's last pair is overwritten by a + 1's; the
      // pairs of [a_begin, a_end) then copied out at once.
      for (int a = a_begin; a < a_end; ++a) pairs_of(a, columns, ld, values);
      // (pair(a, a + 1) is the count of pairs before a's, for a up to F.)
      const int first = shape.pair(a_begin, a_begin + 1);
      const int last = shape.pair(a_end, a_end + 1);
      T* out = shape.top + i * shape.top_ld + shape.width;
      for (int p = first; p < last; ++p) store_as(out + p, values[p]);
      for (int a = a_begin; a < a_end; ++a) copy_cvm(i, a);
      item += static_cast<std::size_t>(a_end - a_begin);
    }
  }
  // values[pair(a, b)] for every b > a, kBlockColumns b at a time from `columns`, each block
  // stored whole.
  void pairs_of(int a, const float* columns, int ld, float* values) const {
    const int features = shape.features();
    const int width = shape.width;
    for (int b0 = a + 1; b0 < features; b0 += kBlockColumns) {
      BlockColumns lane[4] = {};
      int k = 0;
      for (; k + 4 <= width; k += 4) {
        for (int j = 0; j < 4; ++j) {
          BlockColumns vb;
          load_block(columns + (k + j) * ld + b0, &vb);
          lane[j] += columns[(k + j) * ld + a] * vb;
        }
      }
      BlockColumns sum = (lane[0] + lane[2]) + (lane[1] + lane[3]);
      for (; k < width; ++k) {
        BlockColumns vb;
        load_block(columns + k * ld + b0, &vb);
        sum += columns[k * ld + a] * vb;
      }
      std::memcpy(values + shape.pair(a, b0), &sum, sizeof sum);
    }
  }
#endif
  // Slot a's cvm columns behind the pairs.
  GPUBOX_HD void copy_cvm(int64_t i, int a) const {
    if (shape.use_cvm && a < shape.slots) {
      T* out = shape.top + i * shape.top_ld + shape.width;
      const T* block = shape.x0 + i * shape.x0_ld + a * shape.slot_width;
      out[shape.pairs() + 2 * a] = block[0];
      out[shape.pairs() + 2 * a + 1] = block[1];
    }
  }
};

// Item (i, f): g = sum_{b != f} dR[i, d + pair(f, b)] T_b, the gradient of T_f (scaled like dR),
// summed in fp32 memory the item owns (the compiler vectorizes the sum over the columns): a
// slot's in its block of the pooled gradient, then times `unscale` (its cvm columns 0); the
// bottom output's in its row of `d_bottom`, then, plus dR's own first d columns, through its ReLU
// into the bottom's last dZ (with batch norm: into the gradient of the norm's output, unmasked).
template <class T>
struct InteractionBackward {
  InteractionShape<T> shape;
  const float* d_top;  // dR, row stride shape.top_ld
  float* d_pooled;     // [B x slots * slot_width]
  float* d_bottom;     // [B x width]
  T* dz;               // the bottom's last dZ
  int64_t dz_ld;
  float unscale;
  bool relu;  // b is the ReLU's output (no batch norm): dz masked where b = 0
#if !defined(GPUBOX_BACKEND_CUDA)
  // Items [begin, end) on the cpu: an instance's features in groups of up to kGroupFeatures,
  // summed together (sum_blocks) so that each vector is loaded once for the group and the
  // group's additions are independent (one feature's sum is one chain of dependent adds); each
  // feature's sums are operator()'s, in its order.
  void run_range(std::size_t begin, std::size_t end) const {
    const auto features = static_cast<std::size_t>(shape.features());
    for (std::size_t item = begin; item < end;) {
      const auto i = static_cast<int64_t>(item / features);
      const int f = static_cast<int>(item % features);
      const std::size_t group =
          std::min({static_cast<std::size_t>(kGroupFeatures), features - f, end - item});
      switch (group) {
        case 4:
          sum_blocks<4>(i, f);
          break;
        case 3:
          sum_blocks<3>(i, f);
          break;
        case 2:
          sum_blocks<2>(i, f);
          break;
        default:
          sum_blocks<1>(i, f);
          break;
      }
      for (std::size_t g = 0; g < group; ++g) finish(i, f + static_cast<int>(g));
      item += group;
    }
  }
#endif
  GPUBOX_HD void operator()(std::size_t item) const {
    const int features = shape.features();
    const auto i = static_cast<int64_t>(item / static_cast<std::size_t>(features));
    const int f = static_cast<int>(item % static_cast<std::size_t>(features));
#if GPUBOX_ON_DEVICE || defined(GPUBOX_BACKEND_CUDA)
    // A GPU thread sums each column in a register (b inner) and stores it once: the additions
    // and their order of the cpu's form below, which vectorizes over the columns (blocks of
    // kBlockColumns in register vectors, b inner; the tail columns in g, k inner).
    const float* d_pairs = d_top + i * shape.top_ld + shape.width;
    float* g = grad(i, f);
    for (int k = 0; k < shape.width; ++k) {
      float sum = 0.0f;
      for (int b = 0; b < features; ++b) {
        if (b == f) continue;
        sum +=
            d_pairs[b < f ? shape.pair(b, f) : shape.pair(f, b)] * to_float(shape.vector(i, b)[k]);
      }
      g[k] = sum;
    }
    scale_or_route(i, f, g);
#else
    sum_blocks<1>(i, f);
    finish(i, f);
#endif
  }

 private:
  // Where feature f's gradient g goes: a slot's in its block of the pooled gradient, the bottom
  // output's in its row of d_bottom.
  GPUBOX_HD float* grad(int64_t i, int f) const {
    if (f == shape.slots) return d_bottom + i * shape.width;
    const int64_t pooled_ld = static_cast<int64_t>(shape.slots) * shape.slot_width;
    return d_pooled + i * pooled_ld + f * shape.slot_width + shape.vector_column;
  }
  // dR[i, d + pair(f, b)], the pair's gradient (a < b: either order of f and b).
  GPUBOX_HD float d_pair(int64_t i, int f, int b) const {
    return d_top[i * shape.top_ld + shape.width + (b < f ? shape.pair(b, f) : shape.pair(f, b))];
  }
  // g summed: a slot's times `unscale` (its cvm columns 0); the bottom output's plus dR's own
  // first d columns, through its ReLU into dz.
  GPUBOX_HD void scale_or_route(int64_t i, int f, float* g) const {
    const int width = shape.width;
    if (f < shape.slots) {
      for (int k = 0; k < width; ++k) g[k] *= unscale;
      float* d_block = g - shape.vector_column;
      for (int c = 0; c < shape.vector_column; ++c) d_block[c] = 0.0f;
      return;
    }
    const T* b_out = shape.top + i * shape.top_ld;  // the bottom output, ReLU'd
    const float* d_b = d_top + i * shape.top_ld;
    T* dz_row = dz + i * dz_ld;
    for (int k = 0; k < width; ++k) {
      store_as(dz_row + k, !relu || to_float(b_out[k]) > 0.0f ? g[k] + d_b[k] : 0.0f);
    }
  }
#if !defined(GPUBOX_BACKEND_CUDA)
  static constexpr int kGroupFeatures = 4;
  // For features f0 .. f0 + N - 1 of instance i, every whole block of kBlockColumns columns:
  // g[k0, k0 + kBlockColumns) = sum_{b != f} dR[i, d + pair(f, b)] T_b[k0, k0 + kBlockColumns),
  // b in order from 0.0f, summed in register vectors (g may alias the vectors for all the
  // compiler knows, so sums kept in g would be stored and reloaded for every b): each lane the
  // device form's additions for its column.
  template <int N>
  GPUBOX_FORCEINLINE void sum_blocks(int64_t i, int f0) const {
    const int features = shape.features();
    for (int k0 = 0; k0 + kBlockColumns <= shape.width; k0 += kBlockColumns) {
      BlockColumns sum[N] = {};
      for (int b = 0; b < features; ++b) {
        BlockColumns vb;
        load_block(shape.vector(i, b) + k0, &vb);
        for (int j = 0; j < N; ++j) {
          if (b != f0 + j) sum[j] += d_pair(i, f0 + j, b) * vb;
        }
      }
      for (int j = 0; j < N; ++j) std::memcpy(grad(i, f0 + j) + k0, &sum[j], sizeof sum[j]);
    }
  }
  // Feature f's columns past the whole blocks (k inner, in g), then scale_or_route.
  void finish(int64_t i, int f) const {
    const int width = shape.width;
    const int k0 = width - width % kBlockColumns;
    float* g = grad(i, f);
    if (k0 < width) {  // (a width of whole blocks makes no pass over b)
      for (int k = k0; k < width; ++k) g[k] = 0.0f;
      for (int b = 0; b < shape.features(); ++b) {
        if (b == f) continue;
        const float dpair = d_pair(i, f, b);
        const T* vb = shape.vector(i, b);
        for (int k = k0; k < width; ++k) g[k] += dpair * to_float(vb[k]);
      }
    }
    scale_or_route(i, f, g);
  }
#endif
};

// The dense features as the bottom MLP's input rows (float, or Bf16 rounded).
template <class T>
struct BottomInput {
  const float* dense;
  T* rows;
  int64_t ld;
  int dense_dim;
  GPUBOX_HD void operator()(std::size_t item) const {
    const auto i = static_cast<int64_t>(item / static_cast<std::size_t>(dense_dim));
    const int c = static_cast<int>(item % static_cast<std::size_t>(dense_dim));
    store_as(rows + i * ld + c, dense[item]);
  }
};

// Calls launch(rows) with `data` typed as the activation element type (float, or Bf16).
template <class Launch>
void with_type(ElementType type, void* data, Launch launch) {
  if (type == ElementType::kBf16) {
    launch(static_cast<Bf16*>(data));
  } else {
    launch(static_cast<float*>(data));
  }
}
}  // namespace

void DlrmPart::interaction_forward(const device::Stream& stream, const InputRows& x0,
                                   int64_t batch) {
  with_type(activation_, top_in_.data(), [&](auto* top) {
    using T = std::remove_pointer_t<decltype(top)>;
    const InteractionShape<T> shape{static_cast<const T*>(x0.data),
                                    x0.ld,
                                    top,
                                    top_ld_,
                                    slots_,
                                    slot_width_,
                                    vector_column_,
                                    width_,
                                    use_cvm_};
    device::parallel_for(stream, static_cast<std::size_t>(batch) * features(),
                         device::isa_clones(InteractionForward<T>{shape}));
  });
}

void DlrmPart::interaction_backward(const device::Stream& stream, const InputRows& x0,
                                    int64_t batch, float unscale, float* d_pooled) {
  with_type(activation_, top_in_.data(), [&](auto* top) {
    using T = std::remove_pointer_t<decltype(top)>;
    const InteractionShape<T> shape{static_cast<const T*>(x0.data),
                                    x0.ld,
                                    top,
                                    top_ld_,
                                    slots_,
                                    slot_width_,
                                    vector_column_,
                                    width_,
                                    use_cvm_};
    device::parallel_for(
        stream, static_cast<std::size_t>(batch) * features(),
        device::isa_clones(InteractionBackward<T>{
            shape, d_top_in_.data(), d_pooled, d_bottom_.data(), reinterpret_cast<T*>(dz_a_.data()),
            bottom_.back().spec().dz_ld, unscale, norms_.empty()}));
  });
}

void DlrmPart::write_bottom_input(const device::Stream& stream, const float* dense, int64_t batch) {
  with_type(activation_, bottom_in_.data(), [&](auto* rows) {
    using T = std::remove_pointer_t<decltype(rows)>;
    device::parallel_for(stream, static_cast<std::size_t>(batch) * dense_dim_,
                         BottomInput<T>{dense, rows, bottom_in_ld_, dense_dim_});
  });
}

}  // namespace gpubox::trainer
