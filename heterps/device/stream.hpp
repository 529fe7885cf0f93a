// Streams and events: the ordering primitives of a card. Every asynchronous call in GPUBox takes
// the stream it runs on; nothing uses the default stream.
//
// cpu backend: work enqueued on a stream runs synchronously in the calling (card) thread, so
// record/wait/synchronize have nothing left to order; the API is the same so callers are too.
#pragma once

#include <utility>

#if defined(GPUBOX_BACKEND_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace gpubox::device {

#if defined(GPUBOX_BACKEND_CUDA)
using native_stream_t = cudaStream_t;
using native_event_t = cudaEvent_t;
#else
using native_stream_t = void*;
using native_event_t = void*;
#endif

class Event;

// Owning, move-only stream on one card's device. Not thread-safe: one card thread uses it.
class Stream {
 public:
  // Creates a stream on `device` (the CUDA ordinal; ignored on cpu).
  explicit Stream(int device);
  ~Stream();
  Stream(Stream&& other) noexcept : device_(other.device_), handle_(std::exchange(other.handle_, nullptr)) {}
  Stream& operator=(Stream&& other) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  // Blocks until all work enqueued so far has finished.
  void synchronize() const;
  // Later work on this stream waits for `event`.
  void wait(const Event& event) const;
  int device() const { return device_; }
  native_stream_t native() const { return handle_; }

 private:
  int device_ = 0;
  native_stream_t handle_ = nullptr;
};

// Owning, move-only event (timing disabled).
class Event {
 public:
  explicit Event(int device);
  ~Event();
  Event(Event&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  void record(const Stream& stream);
  void synchronize() const;
  native_event_t native() const { return handle_; }

 private:
  native_event_t handle_ = nullptr;
};

}  // namespace gpubox::device
