#include "heterps/device/stream.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "common/error.hpp"
#include "heterps/device/counters.hpp"
#include "heterps/device/cuda_check.hpp"
#include "heterps/device/deferred.hpp"
#include "heterps/device/scratch_arena.hpp"
#include "heterps/device/step_graph.hpp"

namespace gpubox::device {

namespace {
void count_sync(CardCounters* counters) {
  if (counters != nullptr) counters->add_host_sync();
}
void count_wait(CardCounters* counters) {
  if (counters != nullptr) counters->add_stream_wait();
}
void count_host_wait(CardCounters* counters, HostWait counted_as) {
  if (counters != nullptr) counters->add_host_wait(counted_as);
}
}  // namespace

#if defined(GPUBOX_BACKEND_CUDA)

DeviceGuard::DeviceGuard(int device) {
  int current = 0;
  GPUBOX_CUDA_TRY(cudaGetDevice(&current));
  if (current != device) {
    GPUBOX_CUDA_TRY(cudaSetDevice(device));
    previous_ = current;
  }
}
DeviceGuard::DeviceGuard(int device, const std::nothrow_t&) noexcept {
  int current = 0;
  if (cudaGetDevice(&current) == cudaSuccess && current != device &&
      cudaSetDevice(device) == cudaSuccess) {
    previous_ = current;
  }
}
DeviceGuard::~DeviceGuard() {
  if (previous_ >= 0) cudaSetDevice(previous_);  // a destructor cannot throw
}

Stream::Stream(int device, CardCounters* counters, StreamRole role)
    : device_(device), counters_(counters), role_(role) {
  DeviceGuard guard(device);
  GPUBOX_CUDA_TRY(cudaStreamCreateWithFlags(&handle_, cudaStreamNonBlocking));
  allocator_.stream_ = handle_;
  allocator_.device_ = device;
}
Stream::~Stream() {
  if (handle_ == nullptr) return;
  // Destroyed on its own device whatever the calling thread has current (teardown runs on the
  // main thread); pending work completes first (CUDA's rule for cudaStreamDestroy).
  DeviceGuard guard(device_, std::nothrow);
  cudaStreamDestroy(handle_);
}
Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    if (handle_ != nullptr) {
      DeviceGuard guard(device_, std::nothrow);
      cudaStreamDestroy(handle_);
    }
    device_ = other.device_;
    handle_ = std::exchange(other.handle_, nullptr);
    counters_ = other.counters_;
    role_ = other.role_;
    allocator_ = other.allocator_;
  }
  return *this;
}
void Stream::synchronize() const {
  detail::refuse_while_capturing("Stream::synchronize (a host wait)", this);
  count_sync(counters_);
  GPUBOX_CUDA_TRY(cudaStreamSynchronize(handle_));
}
bool Stream::ready() const {
  detail::refuse_while_capturing("Stream::ready (a host poll)", this);
  const cudaError_t state = cudaStreamQuery(handle_);
  if (state == cudaErrorNotReady) return false;
  GPUBOX_CUDA_TRY(state);
  return true;
}
void Stream::wait(const Event& event) const {
  detail::check_event_wait(*this, event);
  count_wait(counters());
  GPUBOX_CUDA_TRY(cudaStreamWaitEvent(handle_, event.native(), 0));
}

Event::Event(int device, CardCounters* counters, EventTiming timing, EventReader reader)
    : device_(device),
      counters_(counters),
      timing_(timing == EventTiming::kOn),
      host_reads_(timing_ || reader == EventReader::kHost) {
  DeviceGuard guard(device);
  GPUBOX_CUDA_TRY(
      cudaEventCreateWithFlags(&handle_, timing_ ? cudaEventDefault : cudaEventDisableTiming));
}
Event::~Event() {
  if (handle_ == nullptr) return;
  DeviceGuard guard(device_, std::nothrow);
  cudaEventDestroy(handle_);
}
Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    if (handle_ != nullptr) {
      DeviceGuard guard(device_, std::nothrow);
      cudaEventDestroy(handle_);
    }
    device_ = other.device_;
    handle_ = std::exchange(other.handle_, nullptr);
    counters_ = other.counters_;
    timing_ = other.timing_;
    host_reads_ = other.host_reads_;
    capture_serial_ = other.capture_serial_;
    captured_in_ = std::move(other.captured_in_);
  }
  return *this;
}
void Event::record(const Stream& stream) {
  note_record(stream);
  GPUBOX_CUDA_TRY(cudaEventRecord(handle_, stream.native()));
}
void Event::synchronize(HostWait counted_as) const {
  detail::refuse_while_capturing("Event::synchronize (a host wait)");
  refuse_captured_read("Event::synchronize");
  count_host_wait(counters_, counted_as);
  GPUBOX_CUDA_TRY(cudaEventSynchronize(handle_));
}
bool Event::ready() const {
  detail::refuse_while_capturing("Event::ready (a host query)");
  refuse_captured_read("Event::ready");
  const cudaError_t state = cudaEventQuery(handle_);
  if (state == cudaErrorNotReady) return false;
  GPUBOX_CUDA_TRY(state);
  return true;
}
double Event::seconds_since(const Event& earlier) const {
  GPUBOX_EXPECTS(timing_ && earlier.timing_, "Event::seconds_since: an event made without timing");
  refuse_captured_read("Event::seconds_since");
  earlier.refuse_captured_read("Event::seconds_since");
  float ms = 0;
  GPUBOX_CUDA_TRY(cudaEventElapsedTime(&ms, earlier.handle_, handle_));
  return static_cast<double>(ms) / 1e3;
}

void detail::synchronize_uncounted(const Stream& stream) {
  refuse_while_capturing("a collective's wait for its stream (a host wait)", &stream);
  GPUBOX_CUDA_TRY(cudaStreamSynchronize(stream.native()));
}

char* ThrustAllocator::allocate(std::ptrdiff_t bytes) {
  if (arena_ != nullptr) return arena_->allocate(bytes);
  GPUBOX_EXPECTS(bytes >= 0, "negative Thrust temporary request ", bytes);
  DeviceGuard guard(device_);
  void* ptr = nullptr;
  GPUBOX_CUDA_TRY(cudaMallocAsync(&ptr, static_cast<std::size_t>(bytes), stream_));
  return static_cast<char*>(ptr);
}
void ThrustAllocator::deallocate(char* ptr, std::size_t bytes) {
  if (arena_ != nullptr) {
    arena_->deallocate(ptr, bytes);
    return;
  }
  DeviceGuard guard(device_, std::nothrow);
  cudaFreeAsync(ptr, stream_);
}

#else  // cpu backend: work on a stream has completed when the enqueueing call returns.

DeviceGuard::DeviceGuard(int) {}
DeviceGuard::DeviceGuard(int, const std::nothrow_t&) noexcept {}
DeviceGuard::~DeviceGuard() = default;

namespace {
const char* role_name(StreamRole role) { return role == StreamRole::kCopy ? "copy" : "compute"; }

// GPUBOX_DEVICE_CHECK=defer: a stream's pending work finishes when it is destroyed (CUDA's rule).
// A destructor cannot throw: an error of that work is printed, and the process aborts (the work
// was a test's, and a lost error would hide the bug the mode looks for).
void finish_deferred(detail::DeferredQueue* queue, int device) noexcept {
  if (queue == nullptr) return;
  try {
    detail::run_deferred(*queue);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "card %d: deferred work failed as its stream was destroyed: %s\n", device,
                 e.what());
    std::abort();
  }
}
}  // namespace

Stream::Stream(int device, CardCounters* counters, StreamRole role)
    : device_(device), counters_(counters), role_(role) {
  allocator_.device_ = device;
  if (deferred_execution_enabled())
    deferred_ = detail::make_deferred_queue(device, role_name(role));
}
Stream::~Stream() { finish_deferred(deferred_.get(), device_); }
Stream& Stream::operator=(Stream&& other) noexcept {
  if (this == &other) return *this;
  finish_deferred(deferred_.get(), device_);
  device_ = other.device_;
  handle_ = std::exchange(other.handle_, nullptr);
  counters_ = other.counters_;
  role_ = other.role_;
  allocator_ = other.allocator_;
  deferred_ = std::move(other.deferred_);
  return *this;
}
void Stream::synchronize() const {
  detail::refuse_while_capturing("Stream::synchronize (a host wait)", this);
  count_sync(counters_);
  if (deferred_ != nullptr) detail::run_deferred(*deferred_);
}
bool Stream::ready() const {
  detail::refuse_while_capturing("Stream::ready (a host poll)", this);
  return deferred_ == nullptr || detail::poll_deferred(*deferred_);
}
void Stream::wait(const Event& event) const {
  detail::check_event_wait(*this, event);
  count_wait(counters());
  // Deferred: the wait is work of this stream that runs the event's stream through its record.
  // (A captured wait is for an event of the same capture, which holds no mark.)
  if (const std::shared_ptr<detail::DeferredMark>& mark = event.deferred_mark()) {
    if (deferred_ != nullptr) {
      detail::defer_wait(*deferred_, mark);
    } else {
      detail::run_through(*mark);
    }
  }
}

Event::Event(int device, CardCounters* counters, EventTiming timing, EventReader reader)
    : device_(device),
      counters_(counters),
      timing_(timing == EventTiming::kOn),
      host_reads_(timing_ || reader == EventReader::kHost) {}
Event::~Event() = default;
Event& Event::operator=(Event&& other) noexcept {
  device_ = other.device_;
  handle_ = std::exchange(other.handle_, nullptr);
  counters_ = other.counters_;
  timing_ = other.timing_;
  host_reads_ = other.host_reads_;
  capture_serial_ = other.capture_serial_;
  captured_in_ = std::move(other.captured_in_);
  recorded_at_ = other.recorded_at_;
  mark_ = std::move(other.mark_);
  return *this;
}
void Event::record(const Stream& stream) {
  note_record(stream);
  mark_.reset();
  if (capture_serial_ != 0) return;
  if (stream.deferred() != nullptr) {
    mark_ = detail::mark_deferred(*stream.deferred(), timing_);
  } else if (timing_) {
    recorded_at_ =
        std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }
}
double Event::seconds_since(const Event& earlier) const {
  GPUBOX_EXPECTS(timing_ && earlier.timing_, "Event::seconds_since: an event made without timing");
  refuse_captured_read("Event::seconds_since");
  earlier.refuse_captured_read("Event::seconds_since");
  // Deferred: CUDA's cudaErrorNotReady for an event the card has not passed (poll ready()).
  for (const Event* e : {this, &earlier}) {
    GPUBOX_EXPECTS(e->mark_ == nullptr || detail::passed(*e->mark_),
                   "Event::seconds_since on card ", device_,
                   ": an event the card has not passed yet (CUDA: cudaErrorNotReady; wait for "
                   "ready() first)");
  }
  const double later_at = mark_ != nullptr ? mark_->at : recorded_at_;
  const double earlier_at = earlier.mark_ != nullptr ? earlier.mark_->at : earlier.recorded_at_;
  return later_at - earlier_at;
}
void Event::synchronize(HostWait counted_as) const {
  detail::refuse_while_capturing("Event::synchronize (a host wait)");
  refuse_captured_read("Event::synchronize");
  count_host_wait(counters_, counted_as);
  if (mark_ != nullptr) detail::run_through(*mark_);
}
bool Event::ready() const {
  detail::refuse_while_capturing("Event::ready (a host query)");
  refuse_captured_read("Event::ready");
  return mark_ == nullptr || detail::poll_deferred(*mark_);
}

void detail::synchronize_uncounted(const Stream& stream) {
  refuse_while_capturing("a collective's wait for its stream (a host wait)", &stream);
  run_deferred(stream);
}

void detail::run_deferred(const Stream& stream) {
  if (DeferredQueue* queue = stream.deferred()) run_deferred(*queue);
}

char* ThrustAllocator::allocate(std::ptrdiff_t bytes) {
  if (arena_ != nullptr) return arena_->allocate(bytes);
  GPUBOX_EXPECTS(bytes >= 0, "negative Thrust temporary request ", bytes);
  void* ptr = std::malloc(bytes > 0 ? static_cast<std::size_t>(bytes) : 1);
  if (ptr == nullptr) GPUBOX_FAIL("cannot allocate ", bytes, " bytes of Thrust temporaries");
  return static_cast<char*>(ptr);
}
void ThrustAllocator::deallocate(char* ptr, std::size_t bytes) {
  if (arena_ != nullptr) {
    arena_->deallocate(ptr, bytes);
    return;
  }
  std::free(ptr);
}

#endif

Stream::Stream(Stream&& other) noexcept
    : device_(other.device_),
      handle_(std::exchange(other.handle_, nullptr)),
      counters_(other.counters_),
      role_(other.role_),
      allocator_(other.allocator_)
#if !defined(GPUBOX_BACKEND_CUDA)
      ,
      deferred_(std::move(other.deferred_))
#endif
{
}

void Event::note_record(const Stream& stream) {
  // On a captured stream, a marker of the capture (Stream::wait inside it); otherwise an eager
  // record the host may read, refused while this thread captures (it would read it mid-step).
  const uint64_t serial = detail::capture_serial_of(stream);
  if (serial == 0) {
    detail::refuse_while_capturing("Event::record (the host reads the event)", &stream);
    captured_in_.clear();
  } else {
    const std::string& graph = stream.capturing()->name();
    if (host_reads_) {
      GPUBOX_FAIL("Event::record of an event the host reads (",
                  timing_ ? "a timed event" : "EventReader::kHost", ") on card ", device_,
                  " inside the capture of step graph '", graph,
                  "': replays do not mark it, so the host's ready, synchronize or seconds_since "
                  "would fail when it reads it; record it after the capture ends, on the stream "
                  "the graph is replayed on (heterps/device/stream.hpp)");
    }
    captured_in_ = graph;
  }
  capture_serial_ = serial;
}

void Event::refuse_captured_read(const char* operation) const {
  if (capture_serial_ == 0) return;
  GPUBOX_FAIL(operation, " of an event on card ", device_,
              " whose last record was inside the capture of step graph '", captured_in_,
              "': replays do not mark it, so the host cannot read it (record it outside the "
              "capture, or make it with EventReader::kHost so that such a record fails where it "
              "is made; heterps/device/stream.hpp)");
}

Event::Event(Event&& other) noexcept
    : device_(other.device_),
      handle_(std::exchange(other.handle_, nullptr)),
      counters_(other.counters_),
      timing_(other.timing_),
      host_reads_(other.host_reads_),
      capture_serial_(other.capture_serial_),
      captured_in_(std::move(other.captured_in_))
#if !defined(GPUBOX_BACKEND_CUDA)
      ,
      recorded_at_(other.recorded_at_),
      mark_(std::move(other.mark_))
#endif
{
}

}  // namespace gpubox::device
