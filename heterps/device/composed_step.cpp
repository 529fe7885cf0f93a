#include "heterps/device/composed_step.hpp"

#include <utility>

#include "common/error.hpp"

namespace gpubox::device {
namespace {

// The step the calling thread has open (one per card thread).
thread_local ComposedStep* t_open_step = nullptr;

}  // namespace

ComposedStep::ComposedStep(const Stream& stream, StepGraph& graph, Mode mode)
    : stream_(&stream), graph_(&graph), mode_(mode) {
  GPUBOX_EXPECTS(t_open_step == nullptr, "composed step '", graph.name(), "' on card ",
                 stream.device(), ": this thread already has a composed step open");
  if (mode_ == Mode::kCapture) graph.begin_capture(stream);  // throws when already capturing
  t_open_step = this;
}

ComposedStep::~ComposedStep() {
  if (!open_) return;
  // Abandoned (an exception is unwinding): the capture is dropped, so nothing of this step runs;
  // the parts whose events were to be recorded forget those slots.
  if (mode_ == Mode::kCapture) graph_->abort_capture();
  close();
  for (std::size_t i = 0; i < deferred_count_; ++i) {
    try {
      if (deferred_[i].on_abandon) deferred_[i].on_abandon();
    } catch (...) {  // the failure being handled is the one to report
    }
  }
}

void ComposedStep::close() noexcept {
  open_ = false;
  if (t_open_step == this) t_open_step = nullptr;
}

void ComposedStep::finish() {
  GPUBOX_EXPECTS(open_, "composed step '", graph_->name(), "': finish twice");
  if (mode_ == Mode::kCapture) graph_->end_capture();  // throws (aborted) on a refused operation
  // From here the step is whole: an error below is the launch's, not a part's.
  graph_->replay(*stream_);
  const std::size_t deferred = std::exchange(deferred_count_, 0);
  close();
  std::size_t i = 0;
  try {
    for (; i < deferred; ++i) {
      deferred_[i].event->record(*stream_);
      deferred_[i].on_abandon = nullptr;
    }
  } catch (...) {
    // An event left unrecorded still holds its record of `depth` steps ago, which reads as
    // passed: its owner forgets the slot rather than read it before the graph wrote it.
    for (; i < deferred; ++i) {
      try {
        if (deferred_[i].on_abandon) deferred_[i].on_abandon();
      } catch (...) {  // the record's failure is the one to report
      }
      deferred_[i].on_abandon = nullptr;
    }
    throw;
  }
}

ComposedStep* ComposedStep::open_on(const Stream& stream) noexcept {
  ComposedStep* step = t_open_step;
  return step != nullptr && step->stream_ == &stream ? step : nullptr;
}

bool ComposedStep::enqueues(const Stream& stream) noexcept {
  const ComposedStep* step = open_on(stream);
  return step == nullptr || step->mode_ == Mode::kCapture;
}

void ComposedStep::defer_record(Event& event, std::function<void()> on_abandon) {
  GPUBOX_EXPECTS(deferred_count_ < kMaxDeferred, "composed step '", graph_->name(), "': over ",
                 kMaxDeferred, " deferred event records");
  deferred_[deferred_count_++] = Deferred{&event, std::move(on_abandon)};
}

}  // namespace gpubox::device
