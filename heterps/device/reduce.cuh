// reduce_into(stream, n, value_at, combine, partials, out): *out = the fold of value_at(i) over
// i in [0, n), written to card memory and ordered on `stream` — no host synchronization and no
// allocation, unlike thrust::reduce, which returns its result to the host (a blocking readback
// per call) and allocates its temporaries.
//
// Levels: level 0 folds chunks of kReduceChunk consecutive indices into one partial each; each
// next level folds chunks of kReduceChunk consecutive partials the same way, until one value
// remains. Within a chunk the fold keeps index order (`combine` need only be associative, not
// commutative); how it brackets the chunk's values is the backend's:
//   CUDA: one block of kReduceChunk threads per chunk, a value per thread, folded by CUB's block
//         reduction (cub::BlockReduce, warp reductions then the warps' results in rank order):
//         no thread folds more than its warp's log2(32) steps and the 8 warps' results (the
//         single-thread fold of 256 values per chunk it replaced was the step's reduction tail).
//   cpu:  each chunk folded left to right by one thread, the chunks spread over the card's
//         threads (parallel_for).
// Both are deterministic: the same inputs give the same bits run after run, whatever the thread
// count or the timing (no atomics). The two backends can differ in the last bits of a
// floating-point fold (other brackets). Tolerance: with L levels, every value passes through at
// most L chunks of at most kReduceChunk operands, so a float64 sum is within
// L * kReduceChunk * DBL_EPSILON * sum|x_i| of the exact sum on either backend (tested against a
// long double reference, device_test); exact combines (integers, order-only) agree bit for bit.
//
// reduce_into_then(stream, n, value_at, combine, empty, partials, finish) is the same fold, but
// instead of storing it, the thread that holds the total calls finish(total) (a GPUBOX_HD
// functor): the last level's block (CUDA) or chunk (cpu) applies it, so a consumer of the total
// (a metric accumulator adding it in, the loss copied into the step's slots) costs no kernel of
// its own, single-threaded, after the reduction. The fold and its bits are reduce_into's.
//
// `partials` (card memory) holds reduce_partials(n) elements; the caller sizes it before the
// step (device rule 1). value_at and combine are trivially copyable GPUBOX_HD functors; T is
// trivially copyable and default-constructible (CUDA: a thread past the last value holds T{},
// which the block reduction leaves out). CUB's block reduction keeps its temporaries in shared
// memory: nothing else is allocated. One parallel_for per level: 1 launch for n <= 256, 2 up to
// 65536, 3 up to 2^24.
#pragma once

#include <cstddef>

#include "common/macros.hpp"
#include "heterps/device/counters.hpp"
#include "heterps/device/parallel_for.cuh"
#include "heterps/device/stream.hpp"

#if defined(GPUBOX_BACKEND_CUDA)
#include <cub/block/block_reduce.cuh>

#include "heterps/device/cuda_check.hpp"
#endif

namespace gpubox::device {

inline constexpr std::size_t kReduceChunk = 256;

// Partials needed by reduce_into for n values (0 when one level writes *out directly).
inline std::size_t reduce_partials(std::size_t n) {
  std::size_t total = 0;
  for (std::size_t level = (n + kReduceChunk - 1) / kReduceChunk; level > 1;
       level = (level + kReduceChunk - 1) / kReduceChunk) {
    total += level;
  }
  return total;
}

namespace detail {
// Where a level's chunk folds go: partials of the next level (WriteAt) or, for the last level's
// single chunk, the caller's finish (FinishAt).
template <class T>
struct WriteAt {
  T* out;
  GPUBOX_HD void operator()(std::size_t c, const T& value) const { out[c] = value; }
};
template <class Finish>
struct FinishAt {
  Finish finish;
  template <class T>
  GPUBOX_HD void operator()(std::size_t, const T& value) const {
    finish(value);
  }
};
template <class T>
struct StoreTotal {
  T* out;
  GPUBOX_HD void operator()(const T& total) const { *out = total; }
};

// sink(c, fold of value_at over [c * chunk, min(n, (c + 1) * chunk))).
template <class T, class ValueAt, class Combine, class Sink>
struct FoldChunks {
  ValueAt value_at;
  Combine combine;
  std::size_t n;
  Sink sink;
  GPUBOX_HD void operator()(std::size_t c) const {
    const std::size_t begin = c * kReduceChunk;
    const std::size_t end = begin + kReduceChunk < n ? begin + kReduceChunk : n;
    T acc = value_at(begin);
    for (std::size_t i = begin + 1; i < end; ++i) acc = combine(acc, value_at(i));
    sink(c, acc);
  }
};
#if defined(GPUBOX_BACKEND_CUDA)
// sink(c, chunk c's fold) (as FoldChunks), one block per chunk (a grid-stride loop over the
// chunks past the grid's size).
template <class T, class ValueAt, class Combine, class Sink>
__global__ void __launch_bounds__(kReduceChunk)
    fold_chunks_kernel(ValueAt value_at, Combine combine, std::size_t n, std::size_t chunks,
                       Sink sink) {
  using BlockReduce = cub::BlockReduce<T, static_cast<int>(kReduceChunk)>;
  __shared__ typename BlockReduce::TempStorage temp;
  for (std::size_t c = blockIdx.x; c < chunks; c += gridDim.x) {
    const std::size_t begin = c * kReduceChunk;
    const std::size_t left = n - begin;
    const int valid = static_cast<int>(left < kReduceChunk ? left : kReduceChunk);
    T value{};
    if (threadIdx.x < static_cast<unsigned>(valid)) value = value_at(begin + threadIdx.x);
    // Only the first `valid` threads' values take part; thread 0 holds the result.
    const T folded = BlockReduce(temp).Reduce(value, combine, valid);
    if (threadIdx.x == 0) sink(c, folded);
    __syncthreads();  // `temp` is reused by the block's next chunk
  }
}
#endif

// One level: sink(c, the fold of chunk c of value_at over [0, n)). Counts one launch.
template <class T, class ValueAt, class Combine, class Sink>
void fold_level(const Stream& stream, std::size_t n, ValueAt value_at, Combine combine, Sink sink) {
  const std::size_t chunks = (n + kReduceChunk - 1) / kReduceChunk;
#if defined(GPUBOX_BACKEND_CUDA)
  if (CardCounters* counters = stream.counters()) counters->add_launches();
  const unsigned grid = static_cast<unsigned>(chunks < 65535 ? chunks : 65535);
  fold_chunks_kernel<T, ValueAt, Combine, Sink>
      <<<grid, static_cast<unsigned>(kReduceChunk), 0, stream.native()>>>(value_at, combine, n,
                                                                          chunks, sink);
  GPUBOX_CUDA_TRY(cudaGetLastError());
#else
  parallel_for(stream, chunks, FoldChunks<T, ValueAt, Combine, Sink>{value_at, combine, n, sink});
#endif
}

template <class T>
struct ReadPartial {
  const T* values;
  GPUBOX_HD T operator()(std::size_t i) const { return values[i]; }
};
template <class T, class Finish>
struct FinishEmpty {
  Finish finish;
  T value;
  GPUBOX_HD void operator()(std::size_t) const { finish(value); }
};
}  // namespace detail

// `empty`: what finish gets when n == 0.
template <class T, class ValueAt, class Combine, class Finish>
void reduce_into_then(const Stream& stream, std::size_t n, ValueAt value_at, Combine combine,
                      T empty, T* partials, Finish finish) {
  if (n == 0) {
    parallel_for(stream, 1, detail::FinishEmpty<T, Finish>{finish, empty});
    return;
  }
  const detail::FinishAt<Finish> last{finish};
  std::size_t chunks = (n + kReduceChunk - 1) / kReduceChunk;
  if (chunks == 1) {
    detail::fold_level<T>(stream, n, value_at, combine, last);
    return;
  }
  T* level_out = partials;
  detail::fold_level<T>(stream, n, value_at, combine, detail::WriteAt<T>{level_out});
  while (chunks > 1) {
    const T* in = level_out;
    const std::size_t count = chunks;
    chunks = (count + kReduceChunk - 1) / kReduceChunk;
    if (chunks == 1) {
      detail::fold_level<T>(stream, count, detail::ReadPartial<T>{in}, combine, last);
    } else {
      level_out += count;
      detail::fold_level<T>(stream, count, detail::ReadPartial<T>{in}, combine,
                            detail::WriteAt<T>{level_out});
    }
  }
}

// `empty`: what *out gets when n == 0.
template <class T, class ValueAt, class Combine>
void reduce_into(const Stream& stream, std::size_t n, ValueAt value_at, Combine combine, T empty,
                 T* partials, T* out) {
  reduce_into_then(stream, n, value_at, combine, empty, partials, detail::StoreTotal<T>{out});
}

}  // namespace gpubox::device
