// parallel_for(stream, n, f[, serial_limit]): calls f(i) for i in [0, n), ordered on `stream`.
// CUDA: a grid-stride kernel. cpu: an OpenMP loop on the calling card's threads (serial for
// n < serial_limit, where a parallel region costs more than it saves; kSerialLoopLimit unless the
// caller's items are each worth many values, as a row of a row kernel is; CUDA ignores it). `f`
// must be trivially copyable, callable on host and device (GPUBOX_HD), and must not throw. Each
// call with n > 0 counts one launch on the stream's card (counters.hpp), on both backends. While
// the stream captures a StepGraph the loop is recorded with a copy of `f` (step_graph.hpp) and runs
// at each replay; under GPUBOX_DEVICE_CHECK=defer it is queued on the stream (deferred.hpp).
//
// cpu hook: an `f` that also has `void run_range(std::size_t begin, std::size_t end) const` gets
// a thread's items [begin, end) in one call instead of one call per item. That form must do
// exactly what f(begin) .. f(end - 1) would; it exists so that a loop can read its invariants
// once and vectorize (through `f`, a float store may alias a float the item reads, so the
// compiler reloads it every item and gives up). CUDA always calls f(i).
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "common/macros.hpp"
#include "heterps/device/counters.hpp"
#include "heterps/device/cuda_check.hpp"
#include "heterps/device/stream.hpp"

#if !defined(GPUBOX_BACKEND_CUDA)
#include <omp.h>
#endif

namespace gpubox::device {

// Below this many iterations (of one value's work each) the cpu backend runs the loop in the
// calling thread.
inline constexpr std::size_t kSerialLoopLimit = 2048;

#if defined(GPUBOX_BACKEND_CUDA)
namespace detail {
template <class F>
__global__ void parallel_for_kernel(std::size_t n, F f) {
  const std::size_t stride = static_cast<std::size_t>(blockDim.x) * gridDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    f(i);
  }
}
}  // namespace detail
#else
namespace detail {
template <class F, class = void>
struct HasRunRange : std::false_type {};
template <class F>
struct HasRunRange<
    F, std::void_t<decltype(std::declval<const F&>().run_range(std::size_t{}, std::size_t{}))>>
    : std::true_type {};

// The cpu backend's loop: in the calling thread for n < serial_limit, else on its OpenMP threads.
template <class F>
void run_loop(std::size_t n, const F& f, std::size_t serial_limit) {
  if (n < serial_limit || omp_get_max_threads() == 1) {
    if constexpr (HasRunRange<F>::value) {
      f.run_range(0, n);
    } else {
      for (std::size_t i = 0; i < n; ++i) f(i);
    }
    return;
  }
  if constexpr (HasRunRange<F>::value) {
    // schedule(static)'s split: one contiguous block of items per thread.
#pragma omp parallel
    {
      const auto threads = static_cast<std::size_t>(omp_get_num_threads());
      const auto thread = static_cast<std::size_t>(omp_get_thread_num());
      const std::size_t begin = n * thread / threads;
      const std::size_t end = n * (thread + 1) / threads;
      if (begin < end) f.run_range(begin, end);
    }
  } else {
    const std::int64_t count = static_cast<std::int64_t>(n);
#pragma omp parallel for schedule(static)
    for (std::int64_t i = 0; i < count; ++i) f(static_cast<std::size_t>(i));
  }
}
}  // namespace detail
#endif

template <class F>
void parallel_for(const Stream& stream, std::size_t n, F f,
                  std::size_t serial_limit = kSerialLoopLimit) {
  if (n == 0) return;
  if (CardCounters* counters = stream.counters()) counters->add_launches();
#if defined(GPUBOX_BACKEND_CUDA)
  constexpr unsigned kBlock = 256;
  const std::size_t blocks = (n + kBlock - 1) / kBlock;
  const unsigned grid = static_cast<unsigned>(blocks < 65536 ? blocks : 65536);
  detail::parallel_for_kernel<<<grid, kBlock, 0, stream.native()>>>(n, f);
  GPUBOX_CUDA_TRY(cudaGetLastError());
  (void)serial_limit;
#else
  if (stream.capturing() != nullptr || stream.deferred() != nullptr) {
    stream.record("parallel_for", [n, f, serial_limit] { detail::run_loop(n, f, serial_limit); });
    return;
  }
  detail::run_loop(n, f, serial_limit);
#endif
}

#if !defined(GPUBOX_BACKEND_CUDA)
// cpu, for run_range forms over the flat items of [rows x width] row-major data (a matrix's
// entries, a record's fields): calls row(i, j_begin, j_end) for each row's part of the items
// [begin, end), rows in order, so that the form divides once per row rather than per item and
// its inner loop over j can vectorize.
template <class Row>
void for_row_segments(std::size_t begin, std::size_t end, int width, Row row) {
  const auto w = static_cast<std::size_t>(width);
  for (std::size_t flat = begin; flat < end;) {
    const std::size_t i = flat / w;
    const std::size_t j = flat - i * w;
    const std::size_t stop = flat + (w - j) < end ? flat + (w - j) : end;
    row(static_cast<int64_t>(i), static_cast<int64_t>(j), static_cast<int64_t>(j + (stop - flat)));
    flat = stop;
  }
}
#endif

}  // namespace gpubox::device
