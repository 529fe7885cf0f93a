#include "heterps/device/stream.hpp"

#include "heterps/device/cuda_check.hpp"

namespace gpubox::device {

#if defined(GPUBOX_BACKEND_CUDA)

Stream::Stream(int device) : device_(device) {
  GPUBOX_CUDA_TRY(cudaSetDevice(device));
  GPUBOX_CUDA_TRY(cudaStreamCreateWithFlags(&handle_, cudaStreamNonBlocking));
}
Stream::~Stream() {
  if (handle_ != nullptr) cudaStreamDestroy(handle_);
}
Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    if (handle_ != nullptr) cudaStreamDestroy(handle_);
    device_ = other.device_;
    handle_ = std::exchange(other.handle_, nullptr);
  }
  return *this;
}
void Stream::synchronize() const { GPUBOX_CUDA_TRY(cudaStreamSynchronize(handle_)); }
void Stream::wait(const Event& event) const {
  GPUBOX_CUDA_TRY(cudaStreamWaitEvent(handle_, event.native(), 0));
}

Event::Event(int device) {
  GPUBOX_CUDA_TRY(cudaSetDevice(device));
  GPUBOX_CUDA_TRY(cudaEventCreateWithFlags(&handle_, cudaEventDisableTiming));
}
Event::~Event() {
  if (handle_ != nullptr) cudaEventDestroy(handle_);
}
Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    if (handle_ != nullptr) cudaEventDestroy(handle_);
    handle_ = std::exchange(other.handle_, nullptr);
  }
  return *this;
}
void Event::record(const Stream& stream) { GPUBOX_CUDA_TRY(cudaEventRecord(handle_, stream.native())); }
void Event::synchronize() const { GPUBOX_CUDA_TRY(cudaEventSynchronize(handle_)); }

#else  // cpu backend: work on a stream has completed when the enqueueing call returns.

Stream::Stream(int device) : device_(device) {}
Stream::~Stream() = default;
Stream& Stream::operator=(Stream&& other) noexcept {
  device_ = other.device_;
  handle_ = std::exchange(other.handle_, nullptr);
  return *this;
}
void Stream::synchronize() const {}
void Stream::wait(const Event&) const {}

Event::Event(int) {}
Event::~Event() = default;
Event& Event::operator=(Event&& other) noexcept {
  handle_ = std::exchange(other.handle_, nullptr);
  return *this;
}
void Event::record(const Stream&) {}
void Event::synchronize() const {}

#endif

}  // namespace gpubox::device
