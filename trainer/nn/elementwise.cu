// SigmoidLogLoss, the bf16 rounding of a float array and the non-finite check: elementwise
// device work.
#include <thrust/execution_policy.h>
#include <thrust/find.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/transform_reduce.h>

#include <algorithm>
#include <cstring>
#include <cuda/atomic>
#include <functional>

#include "common/error.hpp"
#include "common/finite.hpp"
#include "heterps/device/exec_policy.cuh"
#include "heterps/device/isa_clones.cuh"
#include "heterps/device/parallel_for.cuh"
#include "heterps/device/reduce.cuh"
#include "heterps/heter_comm/heter_comm_types.hpp"
#include "trainer/nn/device_math.cuh"
#include "trainer/nn/layers.hpp"

namespace gpubox::trainer {
namespace {
// dz (optional) is the MLP's top gradient: dz_scale * (p - y), as T (float or Bf16); with a
// two-class output (pair_ld > 0) the pair's row [-g, g], each 0 where `relu_out` (when set) is
// not above 0.
template <class T>
struct SigmoidGrad {
  const float* logits;
  const float* labels;
  float* preds;
  float* dlogits;
  T* dz;
  float dz_scale;
  std::size_t pair_ld;
  const T* relu_out;
  GPUBOX_HD void operator()(std::size_t i) const {
    const float p = detail::sigmoid(logits[i]);
    if (preds != nullptr) preds[i] = p;
    const float d = labels != nullptr ? p - labels[i] : 0.0f;
    if (dlogits != nullptr) dlogits[i] = d;
    if (dz == nullptr) return;
    if (pair_ld == 0) {
      store_as(dz + i, dz_scale * d);
      return;
    }
    const float g = dz_scale * d;
    const std::size_t at = i * pair_ld;
    const bool open0 = relu_out == nullptr || to_float(relu_out[at]) > 0.0f;
    const bool open1 = relu_out == nullptr || to_float(relu_out[at + 1]) > 0.0f;
    store_as(dz + at, open0 ? -g : 0.0f);
    store_as(dz + at + 1, open1 ? g : 0.0f);
  }
};
template <class T>
SigmoidGrad<T> sigmoid_grad(const float* logits, const float* labels, float* preds, float* dlogits,
                            T* dz, float dz_scale, std::size_t pair_ld = 0,
                            const void* relu_out = nullptr) {
  return SigmoidGrad<T>{logits, labels,   preds,   dlogits,
                        dz,     dz_scale, pair_ld, static_cast<const T*>(relu_out)};
}
// Item i: logits[i] = u[i, 1] - u[i, 0], the two-class softmax's class-1 logit.
template <class T>
struct PairLogit {
  const T* u;
  std::size_t ld;
  float* logits;
  GPUBOX_HD void operator()(std::size_t i) const {
    logits[i] = to_float(u[i * ld + 1]) - to_float(u[i * ld]);
  }
};
// The batch loss, folded on the card (reduce_into_then: applied by the thread holding the total),
// into *loss and the parameters' loss slot (all-reduced with the gradients): the step's two
// slots after the gradients (DenseParameters::reduced_size) are the loss and the card's stop
// vote (a kernel argument: no copy of its own).
struct StoreStepSlots {
  double* loss;
  float* slots;
  float stop_vote;
  GPUBOX_HD void operator()(double total) const {
    *loss = total;
    slots[0] = static_cast<float>(total);
    slots[1] = stop_vote;
  }
};
struct ReadStopVotes {
  const float* stop_slot;
  uint32_t* votes;
  GPUBOX_HD void operator()(std::size_t) const { *votes = static_cast<uint32_t>(*stop_slot); }
};
struct ToBf16 {
  const float* in;
  Bf16* out;
  GPUBOX_HD void operator()(std::size_t i) const { out[i] = to_bf16(in[i]); }
};
// ToBf16 over the written columns of row-major rows, zero in the padding.
struct ToBf16Rows {
  const float* in;
  Bf16* out;
  std::size_t cols;
  std::size_t ld;
  GPUBOX_HD void operator()(std::size_t i) const {
    out[i] = i % ld < cols ? to_bf16(in[i]) : Bf16{};
  }
#if !defined(GPUBOX_BACKEND_CUDA)
  // cpu: a row's part at a time, the same values: one division a row, not one an element (the
  // per-element form took 5.9% of a dcn bf16 run's samples, 512 x 248 items a step), and a plain
  // loop that vectorizes.
  void run_range(std::size_t begin, std::size_t end) const {
    device::for_row_segments(begin, end, static_cast<int>(ld),
                             [&](int64_t r, int64_t j0, int64_t j1) {
                               const float* __restrict src = in + static_cast<std::size_t>(r) * ld;
                               Bf16* __restrict dst = out + static_cast<std::size_t>(r) * ld;
                               const int64_t written = std::min(j1, static_cast<int64_t>(cols));
                               for (int64_t j = j0; j < written; ++j) dst[j] = to_bf16(src[j]);
                               for (int64_t j = std::max(j0, written); j < j1; ++j) dst[j] = Bf16{};
                             });
  }
#endif
};
struct LogLossAt {
  const float* logits;
  const float* labels;
  GPUBOX_HD double operator()(int64_t i) const {
    return detail::log_loss_from_logit(logits[i], labels[i]);
  }
  GPUBOX_HD double operator()(std::size_t i) const {
    return detail::log_loss_from_logit(logits[i], labels[i]);
  }
};
struct NotFinite {
  GPUBOX_HD bool operator()(float x) const { return !is_finite(x); }
};
struct PlusDouble {
  GPUBOX_HD double operator()(double a, double b) const { return a + b; }
};
// *first_bad = min index of a non-finite value (an atomic only where one is found: rare).
struct MarkNonFinite {
  const float* values;
  uint32_t* first_bad;
  GPUBOX_HD void operator()(std::size_t i) const {
    if (is_finite(values[i])) return;
    cuda::atomic_ref<uint32_t, cuda::thread_scope_device> word(*first_bad);
    word.fetch_min(static_cast<uint32_t>(i), cuda::std::memory_order_relaxed);
  }
#if !defined(GPUBOX_BACKEND_CUDA)
  // cpu: a pass that only tests, on the bits (an all-ones exponent: inf or NaN), so that it
  // vectorizes; then, in a range that has a non-finite value, its first one as above.
  void run_range(std::size_t begin, std::size_t end) const {
    const float* __restrict v = values;
    uint32_t bad = 0;
    for (std::size_t i = begin; i < end; ++i) {
      uint32_t bits;
      std::memcpy(&bits, v + i, sizeof(bits));
      bad |= static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
    }
    if (bad == 0) return;
    std::size_t i = begin;
    while (is_finite(v[i])) ++i;
    (*this)(i);
  }
#endif
};
struct CopyNonFiniteValue {
  const float* values;
  std::size_t n;
  const uint32_t* first_bad;
  float* out;
  GPUBOX_HD void operator()(std::size_t) const {
    if (*first_bad < n) *out = values[*first_bad];
  }
};
}  // namespace

double SigmoidLogLoss::forward_backward(const device::Stream& stream, const float* logits,
                                        const float* labels, int64_t batch, float* preds,
                                        float* dlogits) {
  if (batch == 0) return 0.0;
  device::parallel_for(stream, static_cast<std::size_t>(batch),
                       sigmoid_grad<float>(logits, labels, preds, dlogits, nullptr, 0.0f));
  return device::host_result(stream, [&] {
    return thrust::transform_reduce(device::exec_policy(stream),
                                    thrust::counting_iterator<int64_t>(0),
                                    thrust::counting_iterator<int64_t>(batch),
                                    LogLossAt{logits, labels}, 0.0, thrust::plus<double>());
  });
}

void SigmoidLogLoss::forward_backward_async(const device::Stream& stream, const float* logits,
                                            const float* labels, int64_t batch, float* preds,
                                            float* dlogits, const ScaledGrad& dz, double* loss,
                                            double* partials, float* step_slots, float stop_vote) {
  const auto n = static_cast<std::size_t>(batch);
  const auto pair_ld = static_cast<std::size_t>(dz.pair_ld);
  if (dz.type == ElementType::kBf16) {
    device::parallel_for(stream, n,
                         sigmoid_grad(logits, labels, preds, dlogits, static_cast<Bf16*>(dz.data),
                                      dz.scale, pair_ld, dz.relu_out));
  } else {
    device::parallel_for(stream, n,
                         sigmoid_grad(logits, labels, preds, dlogits, static_cast<float*>(dz.data),
                                      dz.scale, pair_ld, dz.relu_out));
  }
  device::reduce_into_then(stream, n, LogLossAt{logits, labels}, PlusDouble{}, 0.0, partials,
                           StoreStepSlots{loss, step_slots, stop_vote});
}

void SigmoidLogLoss::predict(const device::Stream& stream, const float* logits, int64_t batch,
                             float* preds) {
  device::parallel_for(stream, static_cast<std::size_t>(batch),
                       sigmoid_grad<float>(logits, nullptr, preds, nullptr, nullptr, 0.0f));
}

void SigmoidLogLoss::pair_logits(const device::Stream& stream, const void* u, ElementType type,
                                 int64_t ld, int64_t batch, float* logits) {
  const auto n = static_cast<std::size_t>(batch);
  const auto stride = static_cast<std::size_t>(ld);
  if (type == ElementType::kBf16) {
    device::parallel_for(stream, n, PairLogit<Bf16>{static_cast<const Bf16*>(u), stride, logits});
  } else {
    device::parallel_for(stream, n, PairLogit<float>{static_cast<const float*>(u), stride, logits});
  }
}

std::size_t SigmoidLogLoss::loss_partials(std::size_t batch) {
  return device::reduce_partials(batch);
}

void to_bf16_async(const device::Stream& stream, const float* in, std::size_t n, Bf16* out) {
  device::parallel_for(stream, n, ToBf16{in, out});
}

void to_bf16_rows_async(const device::Stream& stream, const float* in, int64_t rows, int cols,
                        int64_t ld, Bf16* out) {
  GPUBOX_EXPECTS(rows >= 0 && cols >= 0 && cols <= ld, "to_bf16_rows_async: ", rows, " rows of ",
                 cols, " columns at stride ", ld);
  const auto stride = static_cast<std::size_t>(ld);
  device::parallel_for(stream, static_cast<std::size_t>(rows) * stride,
                       ToBf16Rows{in, out, static_cast<std::size_t>(cols), stride});
}

std::size_t find_non_finite(const device::Stream& stream, const float* values, std::size_t n) {
  if (n == 0) return 0;
  const float* hit = device::host_result(stream, [&] {
    return thrust::find_if(device::exec_policy(stream), values, values + n, NotFinite{});
  });
  return static_cast<std::size_t>(hit - values);
}

void find_non_finite_async(const device::Stream& stream, const float* values, std::size_t n,
                           uint32_t* first_bad) {
  GPUBOX_EXPECTS(n < heter_comm::kNoVeto, "finite check over ", n, " values");
  device::memset_bytes_async(first_bad, 0xff, sizeof(uint32_t), stream);  // kNoVeto
  device::parallel_for(stream, n, device::isa_clones(MarkNonFinite{values, first_bad}));
}

void read_stop_votes_async(const device::Stream& stream, const float* stop_slot, uint32_t* votes) {
  device::parallel_for(stream, 1, ReadStopVotes{stop_slot, votes});
}

void copy_non_finite_value_async(const device::Stream& stream, const float* values, std::size_t n,
                                 const uint32_t* first_bad, float* value_out) {
  device::parallel_for(stream, 1, CopyNonFiniteValue{values, n, first_bad, value_out});
}

}  // namespace gpubox::trainer
