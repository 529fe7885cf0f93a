// Streams and events: the ordering primitives of a card. Every asynchronous call in GPUBox takes
// the stream it runs on; nothing uses the default stream.
//
// cpu backend: work enqueued on a stream runs synchronously in the calling (card) thread, so
// record/wait/synchronize have nothing left to order; the API is the same so callers are too.
// Under GPUBOX_DEVICE_CHECK=defer (deferred.hpp) the work waits in a queue per stream until a
// wait demands it instead, so that a missing or wrong wait shows on the cpu as it would on a GPU.
//
// A card's stream also carries the card's accounting (counters.hpp: synchronize() counts a host
// synchronization) and its scratch arena (Thrust's temporaries, exec_policy.cuh), so every call
// that takes a stream is counted and allocates from the card without being handed either.
//
// Capture (step_graph.hpp): while a StepGraph captures a stream, its work is recorded into the
// graph (CUDA: stream capture; cpu: device::enqueue below records instead of running), and the
// capturing thread may not wait for the card, allocate or free, or copy through pageable memory:
// those calls throw, naming the operation and the graph (detail::refuse_while_capturing).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <new>
#include <string>
#include <utility>

#if defined(GPUBOX_BACKEND_CUDA)
#include <cuda_runtime_api.h>
#endif

#include "heterps/device/counters.hpp"  // HostWait

namespace gpubox::device {

#if defined(GPUBOX_BACKEND_CUDA)
using native_stream_t = cudaStream_t;
using native_event_t = cudaEvent_t;
#else
using native_stream_t = void*;
using native_event_t = void*;
#endif

class Event;
class ScratchArena;
class StepGraph;
namespace detail {
class DeferredQueue;
struct DeferredMark;
}  // namespace detail

// Makes `device` the calling thread's current CUDA device for the guard's lifetime and restores
// the previous one after (nothing on cpu). Device selection in GPUBox is explicit and scoped:
// library code never leaves the thread on another device than it found it.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  // For destructors: errors are ignored (the device is switched when the runtime allows it).
  DeviceGuard(int device, const std::nothrow_t&) noexcept;
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;  // -1: nothing to restore
};

// Thrust's allocator for the algorithms run on one stream (value_type char, as Thrust wants):
// temporaries come from the stream's scratch arena when the card bound one, else from a plain
// stream-ordered allocation. Held by the Stream; exec_policy passes it by reference.
class ThrustAllocator {
 public:
  using value_type = char;
  char* allocate(std::ptrdiff_t bytes);
  void deallocate(char* ptr, std::size_t bytes);

 private:
  friend class Stream;
  ScratchArena* arena_ = nullptr;
  native_stream_t stream_ = nullptr;
  int device_ = 0;
};

// What a card's stream is for. A copy stream (Card::copy_stream) carries host<->card copies
// that overlap the compute stream's work; its copies are also counted as copy_stream_copies,
// and it takes no Thrust call, launch or collective.
enum class StreamRole { kCompute, kCopy };

// Owning, move-only stream on one card's device. Not thread-safe: one card thread uses it.
class Stream {
 public:
  // Creates a stream on `device` (the CUDA ordinal; ignored on cpu). `counters` (may be null)
  // receive this stream's host synchronizations, launches and copies.
  explicit Stream(int device, CardCounters* counters = nullptr,
                  StreamRole role = StreamRole::kCompute);
  ~Stream();
  Stream(Stream&& other) noexcept;
  Stream& operator=(Stream&& other) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  // Blocks until all work enqueued so far has finished. Counts one host synchronization. After a
  // collective, prefer Communicator::synchronize (bounded by the group's timeout).
  void synchronize() const;
  // Non-blocking: true when all work enqueued so far has finished (always on cpu). Throws on a
  // device error. Not counted (a poll, not a wait).
  bool ready() const;
  // Later work on this stream waits for `event` (the card orders it; the host goes on). Counted
  // as a stream wait, not a host synchronization. cpu backend: the event's work has completed
  // when it was enqueued, so there is nothing to order (GPUBOX_DEVICE_CHECK=defer: the wait is
  // queued, and runs the event's stream through its record when reached; deferred.hpp).
  // Capture (CUDA's rule, on both backends): while this stream captures a StepGraph, the event
  // must have been recorded on a captured stream in the same capture (an edge inside the graph);
  // one recorded outside it is refused, naming Stream::wait (CUDA would end the capture with
  // cudaErrorStreamCaptureIsolation). A stream that is not captured may not wait for an event
  // recorded inside a capture (CUDA would pull it into the capture, a fork the device layer does
  // not hold).
  void wait(const Event& event) const;
  int device() const { return device_; }
  StreamRole role() const { return role_; }
  native_stream_t native() const { return handle_; }
  // Where this stream's launches, copies and collectives are counted: the card's counters, or
  // while a StepGraph captures the stream, the graph's (what it will replay).
  CardCounters* counters() const {
    return capture_counters_ != nullptr ? capture_counters_ : counters_;
  }
  // The StepGraph capturing this stream's work, or null.
  StepGraph* capturing() const { return capture_; }
#if !defined(GPUBOX_BACKEND_CUDA)
  // cpu backend, while capturing: appends `work` to the capturing graph (step_graph.cpp); it
  // runs when the graph is replayed. Else, on a deferring stream: appends it to the stream's
  // queue (deferred.hpp). `what` names it in errors. Use device::enqueue.
  void record(const char* what, std::function<void()> work) const;
  // GPUBOX_DEVICE_CHECK=defer: the queue of this stream's work not yet run; null otherwise.
  detail::DeferredQueue* deferred() const { return deferred_.get(); }
#endif

  // The card binds its scratch arena once (Card's constructor); Thrust calls on this stream take
  // their temporaries from it (exec_policy).
  void bind_scratch(ScratchArena* arena) { allocator_.arena_ = arena; }
  ScratchArena* scratch() const { return allocator_.arena_; }
  ThrustAllocator& thrust_allocator() const { return allocator_; }

 private:
  friend class StepGraph;
  int device_ = 0;
  native_stream_t handle_ = nullptr;
  CardCounters* counters_ = nullptr;
  StreamRole role_ = StreamRole::kCompute;
  mutable ThrustAllocator allocator_;
  // Set by StepGraph::begin_capture, cleared by end_capture / abort_capture (not moved).
  mutable StepGraph* capture_ = nullptr;
  mutable CardCounters* capture_counters_ = nullptr;
#if !defined(GPUBOX_BACKEND_CUDA)
  std::shared_ptr<detail::DeferredQueue> deferred_;  // deferred.hpp; null unless checking
#endif
};

// Runs `work`, host code that performs or enqueues one operation on `stream`: now, or on the
// cpu backend while the stream captures a StepGraph, each time the graph is replayed (CUDA
// captures what `work` enqueues itself). `work` must hold copies of what it reads (capture by
// value: it may run after the caller returned, and again at every replay). `what` names the
// operation in errors.
template <class Work>
void enqueue(const Stream& stream, const char* what, Work&& work) {
#if !defined(GPUBOX_BACKEND_CUDA)
  if (stream.capturing() != nullptr || stream.deferred() != nullptr) {
    stream.record(what, std::function<void()>(std::forward<Work>(work)));
    return;
  }
#endif
  (void)what;
  work();
}

namespace detail {
#if !defined(GPUBOX_BACKEND_CUDA)
// Runs the work `stream` deferred so far (deferred.hpp); no-op on a stream that defers nothing.
void run_deferred(const Stream& stream);
#endif
}  // namespace detail

// As enqueue, for work that must run on the calling thread (a collective of the in-process group
// meets its peers' threads): while capturing it is recorded; otherwise the stream's deferred work
// (GPUBOX_DEVICE_CHECK=defer) runs first and then `work`, now, in the stream's order.
template <class Work>
void enqueue_in_order(const Stream& stream, const char* what, Work&& work) {
#if !defined(GPUBOX_BACKEND_CUDA)
  if (stream.capturing() != nullptr) {
    stream.record(what, std::function<void()>(std::forward<Work>(work)));
    return;
  }
  if (stream.deferred() != nullptr) detail::run_deferred(stream);
#endif
  (void)what;
  work();
}

// Whether an event records when the card passed it (Event::seconds_since).
enum class EventTiming { kOff, kOn };

// Who reads an event. kStreams: streams wait for it (Stream::wait), the host may too. kHost: the
// host reads it (ready, synchronize, seconds_since: a late readback's slot, a chunk's end); such
// an event may not be recorded inside a step graph's capture (replays do not mark it), and
// Event::record refuses it at once, naming the graph, instead of the host's read failing steps
// later. A timed event (EventTiming::kOn) is read by the host.
enum class EventReader { kStreams, kHost };

// Owning, move-only event (timing off unless asked for).
class Event {
 public:
  // `counters` (may be null) receive the host waits of synchronize().
  explicit Event(int device, CardCounters* counters = nullptr,
                 EventTiming timing = EventTiming::kOff,
                 EventReader reader = EventReader::kStreams);
  ~Event();
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  // Marks `stream`'s work so far. While `stream` captures a StepGraph, the record is part of the
  // capture (CUDA: a capture-internal marker, not a node): later captured work of that capture
  // may wait for it (Stream::wait), and nothing else may, the host included: replays do not mark
  // it, so ready(), synchronize() and seconds_since() refuse it (naming the graph) until an eager
  // record. An event the host reads (EventReader::kHost, or timed) is refused here instead.
  void record(const Stream& stream);
  // Blocks until the recorded work has finished; counts one host wait, as `counted_as` says.
  void synchronize(HostWait counted_as = HostWait::kSync) const;
  // Whether the recorded work has finished (cudaEventQuery), without waiting; an event never
  // recorded is ready. No host synchronization is counted: nothing waits.
  bool ready() const;
  // Seconds of card time from `earlier` to this event, both made with EventTiming::kOn,
  // recorded, and passed (ready(): the call does not wait). cpu backend: the host time between
  // the two records (work on a stream has completed when it is enqueued).
  double seconds_since(const Event& earlier) const;
  native_event_t native() const { return handle_; }
  // The capture its last record was made in (StepGraph::capture_serial), 0 for an eager record.
  uint64_t capture_serial() const { return capture_serial_; }
  bool host_reads() const { return host_reads_; }
#if !defined(GPUBOX_BACKEND_CUDA)
  // GPUBOX_DEVICE_CHECK=defer: where the last eager record is in its stream's queue; null when
  // the stream defers nothing (deferred.hpp).
  const std::shared_ptr<detail::DeferredMark>& deferred_mark() const { return mark_; }
#endif

 private:
  // Both backends' bookkeeping of a record on `stream` (before the native record): the capture
  // it is in, refused for an event the host reads.
  void note_record(const Stream& stream);
  // Refuses `operation` (a host read) of an event last recorded inside a capture.
  void refuse_captured_read(const char* operation) const;

  int device_ = 0;
  native_event_t handle_ = nullptr;
  CardCounters* counters_ = nullptr;
  bool timing_ = false;
  bool host_reads_ = false;  // EventReader::kHost or timed
  uint64_t capture_serial_ = 0;
  std::string captured_in_;  // the step graph of a record inside a capture (errors)
#if !defined(GPUBOX_BACKEND_CUDA)
  double recorded_at_ = 0;  // cpu: steady-clock seconds of the last record
  std::shared_ptr<detail::DeferredMark> mark_;
#endif
};

namespace detail {
// Throws gpubox::Error naming `operation` and the step graph being captured when the calling
// thread captures one (or `stream`, if given, is being captured): the operations a captured step
// may not contain (a host wait, an allocation, a pageable copy, a Thrust call on the cpu
// backend). Returns at once otherwise.
void refuse_while_capturing(const char* operation, const Stream* stream = nullptr);
// The same for a call that cannot throw (a free): the capture fails at its end_capture, whose
// error names `operation`.
void note_while_capturing(const char* operation) noexcept;
// Whether the calling thread is capturing a step graph.
bool thread_capturing() noexcept;
// Stream::wait's capture rule (see there): throws gpubox::Error naming Stream::wait, the card and
// the graph when `stream` may not wait for `event` now.
void check_event_wait(const Stream& stream, const Event& event);
// StepGraph::capture_serial of the capture `stream` is in (0: none).
uint64_t capture_serial_of(const Stream& stream) noexcept;

// Waits for `stream` without counting it: only for a communicator implementation whose
// collective must see the caller's earlier work done (the in-process group on the cpu backend,
// where this is a no-op). The Communicator's public methods count the collective itself.
void synchronize_uncounted(const Stream& stream);
}  // namespace detail

}  // namespace gpubox::device
