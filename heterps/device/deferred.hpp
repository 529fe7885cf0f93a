// Deferred execution: the cpu backend's check of stream order (GPUBOX_DEVICE_CHECK=defer).
//
// The cpu backend runs work when it is enqueued, so a kernel on one stream that reads what a copy
// on another stream has not finished, a wait for the wrong event, an event recorded before the
// write it should follow, or the host reading a pinned readback before its event passed all
// work on the cpu and only fail on a GPU. With GPUBOX_DEVICE_CHECK=defer each stream holds a
// queue instead, and work waits there until something demands it:
//   - the host waits for it: Stream::synchronize, Event::synchronize (through that event's record
//     only), a blocking readback (host_result), a Thrust call on the stream (the cpu backend runs
//     those when called), a collective on the stream (the in-process group meets its peers on the
//     calling thread), free_pinned (cudaFreeHost waits for the whole device: every queue);
//   - another stream's queue reaches a Stream::wait for an event recorded on it: that stream runs
//     its work up to the event's record, and no further;
//   - Stream::ready / Event::ready find it pending: they answer false, and the work then runs
//     (the card went on meanwhile), so a polling loop progresses; with a poll lag of n
//     (set_deferred_poll_lag, a test's) only the n-th such poll of a queue since its work last
//     ran runs it, as a card that is n polls behind the host: a loop that counted on a poll's
//     progress shows it;
//   - the stream is destroyed (cudaStreamDestroy lets pending work finish).
// So a consumer that did not wait for the right event reads the data as it was before the
// producer's work: the engine's tests, which compare against oracles, see wrong values.
// GPUBOX_DEVICE_CHECK=defer:<seed> adds a seeded coin per enqueue that runs the stream's queue at
// once: streams then run ahead of each other in a varying order, which also exposes the reverse
// hazard (a copy overwriting what another stream's kernel has not read yet).
//
// Why this design and not a tracker of each buffer's last writer (stream, event epoch) checked at
// each read: the device layer knows the buffers a copy touches but not those a kernel reads or
// writes (a parallel_for functor, a GEMM, a sort hold raw pointers), so a tracker sees only
// copy-to-copy hazards; deferring the work itself exposes every hazard whose stale data changes a
// result, kernels included, with no annotation of the engine's code. What it shows is a wrong
// value, not an error naming both operations: run the failing test under both modes, then bisect
// its waits. It can miss a hazard whose stale and fresh data are equal.
//
// Semantics kept from CUDA so correct code runs unchanged: a copy from pageable memory takes its
// source when enqueued (cudaMemcpyAsync stages it), a copy into pageable memory runs when
// enqueued after the stream's earlier work (cudaMemcpyAsync to pageable memory returns when it is
// done), a card free (CardMemory::deallocate) is ordered on its stream (cudaFreeAsync), and an
// error in deferred work surfaces where the work runs (a later synchronize), naming the work.
// Captures (step_graph.hpp) record as before; a replay without collectives is deferred as one
// piece of work, one with collectives runs in order at the replay.
//
// Default (GPUBOX_DEVICE_CHECK unset, or 1): streams hold no queue; every check below is one null
// pointer test. The mode is fixed for a stream when it is made (set_deferred_execution affects
// streams made after it). Thread-safety: a queue may be run by any thread (a peer card's wait, a
// free_pinned); one thread runs it at a time, in enqueue order.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

namespace gpubox::device {

class Stream;

// Whether streams made from now on defer their work, and the seed (0: no coin, fully lazy).
// Read from GPUBOX_DEVICE_CHECK ("defer" or "defer:<seed>") at the first call, or set by a test.
bool deferred_execution_enabled();
uint64_t deferred_execution_seed();
void set_deferred_execution(bool enabled, uint64_t seed = 0);
// How many polls (Stream::ready, Event::ready) of a deferring stream's pending work answer false
// before that work runs (default 1: the first runs it): the n-th poll that finds the stream's
// work pending, counted from the last time any of its work ran (a poll, a wait, a synchronize),
// runs it through what that poll asked for. Process-wide, read at each poll (every stream, at
// once); >= 1.
unsigned deferred_poll_lag();
void set_deferred_poll_lag(unsigned polls);

namespace detail {

class DeferredQueue;

// An event's last eager record on a deferring stream: passed once the queue has run `seq`.
struct DeferredMark {
  std::weak_ptr<DeferredQueue> queue;
  uint64_t seq = 0;
  double at = 0;  // timing events: steady-clock seconds when the record ran
};

// A new queue for a stream of `device` (`role` names it in errors: "compute", "copy").
std::shared_ptr<DeferredQueue> make_deferred_queue(int device, const char* role);
// Appends `work` (named `what` in errors); may run the queue at once (the seeded coin) unless
// `may_run_now` is false (a caller that must not throw: a free).
void defer(DeferredQueue& queue, const char* what, std::function<void()> work,
           bool may_run_now = true);
// Runs every piece of work enqueued so far (the calling thread runs it).
void run_deferred(DeferredQueue& queue);
// Whether the queue has nothing pending (an idle stream: what it is given next passes at once if
// it needs no work of its own, a free or a timed record).
bool deferred_idle(DeferredQueue& queue);
// Runs every queue of the process (free_pinned: a device-wide wait).
void run_all_deferred();
// A mark after the queue's work so far; `timed`: the record runs as work of its own and stamps
// the mark's time when it runs.
std::shared_ptr<DeferredMark> mark_deferred(DeferredQueue& queue, bool timed);
// Whether the mark has passed; when not, answers false, and runs its queue through it when this
// is the poll lag's n-th such poll of the queue since its work last ran (deferred_poll_lag).
bool poll_deferred(const DeferredMark& mark);
// The same for all the queue's work so far.
bool poll_deferred(DeferredQueue& queue);
// Whether the mark has passed (nothing runs).
bool passed(const DeferredMark& mark);
// Runs the mark's queue through the mark.
void run_through(const DeferredMark& mark);
// Appends to `queue` a wait: when reached, runs the mark's queue through the mark.
void defer_wait(DeferredQueue& queue, std::shared_ptr<const DeferredMark> mark);

}  // namespace detail
}  // namespace gpubox::device
