#include "heterps/device/stream.hpp"

#include <chrono>
#include <cstdlib>

#include "common/error.hpp"
#include "heterps/device/counters.hpp"
#include "heterps/device/cuda_check.hpp"
#include "heterps/device/scratch_arena.hpp"

namespace gpubox::device {

namespace {
void count_sync(CardCounters* counters) {
  if (counters != nullptr) counters->add_host_sync();
}
void count_wait(CardCounters* counters) {
  if (counters != nullptr) counters->add_stream_wait();
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

Event::Event(int device, CardCounters* counters, EventTiming timing)
    : device_(device), counters_(counters), timing_(timing == EventTiming::kOn) {
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
    capture_serial_ = other.capture_serial_;
  }
  return *this;
}
void Event::record(const Stream& stream) {
  // On a captured stream, a marker of the capture (Stream::wait inside it); otherwise an eager
  // record the host may read, refused while this thread captures (it would read it mid-step).
  const uint64_t serial = detail::capture_serial_of(stream);
  if (serial == 0)
    detail::refuse_while_capturing("Event::record (the host reads the event)", &stream);
  GPUBOX_CUDA_TRY(cudaEventRecord(handle_, stream.native()));
  capture_serial_ = serial;
}
void Event::synchronize() const {
  detail::refuse_while_capturing("Event::synchronize (a host wait)");
  refuse_captured_read("Event::synchronize");
  count_sync(counters_);
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

Stream::Stream(int device, CardCounters* counters, StreamRole role)
    : device_(device), counters_(counters), role_(role) {
  allocator_.device_ = device;
}
Stream::~Stream() = default;
Stream& Stream::operator=(Stream&& other) noexcept {
  device_ = other.device_;
  handle_ = std::exchange(other.handle_, nullptr);
  counters_ = other.counters_;
  role_ = other.role_;
  allocator_ = other.allocator_;
  return *this;
}
void Stream::synchronize() const {
  detail::refuse_while_capturing("Stream::synchronize (a host wait)", this);
  count_sync(counters_);
}
bool Stream::ready() const {
  detail::refuse_while_capturing("Stream::ready (a host poll)", this);
  return true;
}
void Stream::wait(const Event& event) const {
  detail::check_event_wait(*this, event);
  count_wait(counters());
}

Event::Event(int device, CardCounters* counters, EventTiming timing)
    : device_(device), counters_(counters), timing_(timing == EventTiming::kOn) {}
Event::~Event() = default;
Event& Event::operator=(Event&& other) noexcept {
  device_ = other.device_;
  handle_ = std::exchange(other.handle_, nullptr);
  counters_ = other.counters_;
  timing_ = other.timing_;
  capture_serial_ = other.capture_serial_;
  recorded_at_ = other.recorded_at_;
  return *this;
}
void Event::record(const Stream& stream) {
  const uint64_t serial = detail::capture_serial_of(stream);  // as on CUDA, above
  if (serial == 0)
    detail::refuse_while_capturing("Event::record (the host reads the event)", &stream);
  capture_serial_ = serial;
  if (timing_ && serial == 0) {
    recorded_at_ =
        std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }
}
double Event::seconds_since(const Event& earlier) const {
  GPUBOX_EXPECTS(timing_ && earlier.timing_, "Event::seconds_since: an event made without timing");
  refuse_captured_read("Event::seconds_since");
  earlier.refuse_captured_read("Event::seconds_since");
  return recorded_at_ - earlier.recorded_at_;
}
void Event::synchronize() const {
  detail::refuse_while_capturing("Event::synchronize (a host wait)");
  refuse_captured_read("Event::synchronize");
  count_sync(counters_);
}
bool Event::ready() const {
  detail::refuse_while_capturing("Event::ready (a host query)");
  refuse_captured_read("Event::ready");
  return true;
}

void detail::synchronize_uncounted(const Stream& stream) {
  refuse_while_capturing("a collective's wait for its stream (a host wait)", &stream);
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
      allocator_(other.allocator_) {}

void Event::refuse_captured_read(const char* operation) const {
  if (capture_serial_ == 0) return;
  GPUBOX_FAIL(operation, " of an event on card ", device_,
              " whose last record was inside a step graph's capture: replays do not mark it, so "
              "the host cannot read it (record it outside the capture; heterps/device/stream.hpp)");
}

Event::Event(Event&& other) noexcept
    : device_(other.device_),
      handle_(std::exchange(other.handle_, nullptr)),
      counters_(other.counters_),
      timing_(other.timing_),
      capture_serial_(other.capture_serial_)
#if !defined(GPUBOX_BACKEND_CUDA)
      ,
      recorded_at_(other.recorded_at_)
#endif
{
}

}  // namespace gpubox::device
