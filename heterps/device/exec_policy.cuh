// The Thrust execution policy for a card's stream: thrust::cuda::par_nosync on CUDA (ordered on
// the stream; the caller synchronizes before reading results on the host), thrust::omp::par on
// the cpu backend (runs on the calling card's OpenMP threads). Temporaries come from the
// stream's scratch arena (the card binds it: device rule 4 in card.hpp), never from a
// malloc/free per call. Each policy made here counts one launch on the stream's card (a Thrust
// algorithm launches one kernel or a few: the count is a lower bound on CUDA).
#pragma once

#include <thrust/execution_policy.h>

#include "heterps/device/counters.hpp"
#include "heterps/device/stream.hpp"

#if defined(GPUBOX_BACKEND_CUDA)
#include <thrust/system/cuda/execution_policy.h>
#else
#include <thrust/system/omp/execution_policy.h>
#endif

namespace gpubox::device {

// Counts one Thrust algorithm call on the stream's card. exec_policy calls it; code that runs a
// Thrust algorithm with another policy on a card's data (e.g. thrust::cpp::par for a small
// input on the cpu backend) calls it itself, so both backends count the same.
// A Thrust call cannot be recorded on the cpu backend (it runs when called), so a captured step
// has none, on either backend (step_graph.hpp): it is refused here, naming itself.
inline void count_thrust_call(const Stream& stream) {
  detail::refuse_while_capturing("a Thrust call (exec_policy; use parallel_for or reduce_into)",
                                 &stream);
  if (CardCounters* counters = stream.counters()) counters->add_launches();
#if !defined(GPUBOX_BACKEND_CUDA)
  // GPUBOX_DEVICE_CHECK=defer (deferred.hpp): the call runs now, after the stream's earlier work.
  if (stream.deferred() != nullptr) detail::run_deferred(stream);
#endif
}

// For a policy made before work enqueued on its stream since (a parallel_for, a copy) and used by
// a Thrust call after that work: call this between the two. Nothing on CUDA (the stream orders
// them) nor by default on the cpu (the work ran when enqueued); under GPUBOX_DEVICE_CHECK=defer
// the stream's queued work runs first, since the Thrust call runs when made. Counts nothing.
inline void before_thrust_call(const Stream& stream) {
#if !defined(GPUBOX_BACKEND_CUDA)
  if (stream.deferred() != nullptr) detail::run_deferred(stream);
#else
  (void)stream;
#endif
}

inline auto exec_policy(const Stream& stream) {
  count_thrust_call(stream);
#if defined(GPUBOX_BACKEND_CUDA)
  return thrust::cuda::par_nosync(stream.thrust_allocator()).on(stream.native());
#else
  return thrust::omp::par(stream.thrust_allocator());
#endif
}

// The same policy with Thrust's temporary storage taken from `allocator` (value_type char,
// allocate(std::ptrdiff_t), deallocate(char*, std::size_t); held by reference).
template <class Allocator>
auto exec_policy(const Stream& stream, Allocator& allocator) {
  count_thrust_call(stream);
#if defined(GPUBOX_BACKEND_CUDA)
  return thrust::cuda::par_nosync(allocator).on(stream.native());
#else
  return thrust::omp::par(allocator);
#endif
}

// Runs `algorithm`, a Thrust call whose result the host reads (reduce, count_if, find, the end
// iterator of copy_if / remove_if), and counts the wait for the card that implies (a blocking
// readback, as much as a stream synchronization). Returns its result. The training step uses
// none: its reductions stay on the card (reduce.cuh).
template <class Algorithm>
auto host_result(const Stream& stream, Algorithm&& algorithm) {
  detail::refuse_while_capturing("host_result (a blocking Thrust readback)", &stream);
  auto result = algorithm();
  if (CardCounters* counters = stream.counters()) counters->add_host_sync();
  return result;
}

}  // namespace gpubox::device
