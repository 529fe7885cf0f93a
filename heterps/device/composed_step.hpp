// ComposedStep: ONE step graph (step_graph.hpp) made of the card work of several owners, so that
// a training step whose parts live in different objects (the trainer's dense half, HeterComm's
// sparse half, the late readback rings of both) is one graph launch (issue 31, item 3).
//
//   ComposedStep step(stream, graph, graph.ready() ? kReplay : kCapture);
//   heter_comm.pull(...);      // its host part runs; its card work is captured, or skipped
//   if (ComposedStep::enqueues(stream)) model.forward_backward_async(...);
//   ring.copy_on_card(stream, ...);   // late_readback.hpp: skipped when replaying
//   heter_comm.push_pulled(...);
//   step.finish();             // ends the capture, launches the graph, records deferred events
//
// The contract of a part, while a step is open on its stream (open_on(stream) != null):
//  - it enqueues its card work only when enqueues(stream): true while capturing (the work is
//    recorded into the step's graph), false while replaying (the graph already holds it). Its host
//    part (bookkeeping, tags, counts from a plan) runs every step either way;
//  - it makes no step graph of its own (a capture cannot nest);
//  - an event it records for the host to read later (a ring slot's, LateReadback::commit) goes
//    through defer_record: it is recorded at finish(), after the graph's launch (an event
//    recorded inside a capture cannot be read by the host, and recorded before the launch it
//    would pass before the work it stands for). Abandoned (an error before finish), the step
//    runs each deferred record's on_abandon hook instead.
// Whatever changes from step to step must reach the card work through card memory (a ring's
// slot counter, the batch's count in its upload block) or through the graph's key (its owner
// captures one graph per such value), never as a host value baked into a capture.
//
// Thread-safety: the card's thread; one open step per thread.
#pragma once

#include <array>
#include <cstddef>
#include <functional>

#include "heterps/device/step_graph.hpp"
#include "heterps/device/stream.hpp"

namespace gpubox::device {

class ComposedStep {
 public:
  enum class Mode {
    kCapture,  // the parts' card work is captured into the graph, then the graph is launched
    kReplay,   // the graph holds the work already: the parts run their host parts only
  };
  // Opens the step on `stream` (kCapture: begins the graph's capture). Throws when this thread
  // already has a step open or captures a graph.
  ComposedStep(const Stream& stream, StepGraph& graph, Mode mode);
  // An unfinished step is abandoned: its capture aborted, each deferred record's on_abandon run.
  ~ComposedStep();
  ComposedStep(const ComposedStep&) = delete;
  ComposedStep& operator=(const ComposedStep&) = delete;

  // Ends the capture (kCapture), launches the graph (one graph launch), then records the
  // deferred events on the stream. The step is closed after it, also when it throws.
  void finish();

  // The step open on `stream` by this thread, or null.
  static ComposedStep* open_on(const Stream& stream) noexcept;
  // Whether a part should enqueue its card work on `stream` now: false only while a step replays
  // there (its graph holds the work).
  static bool enqueues(const Stream& stream) noexcept;

  // Records `event` on the step's stream at finish() (after the graph launch); `on_abandon` runs
  // instead when the step is abandoned. At most kMaxDeferred per step.
  static constexpr std::size_t kMaxDeferred = 8;
  void defer_record(Event& event, std::function<void()> on_abandon);

  Mode mode() const { return mode_; }

 private:
  void close() noexcept;

  const Stream* stream_;
  StepGraph* graph_;
  Mode mode_;
  bool open_ = true;
  struct Deferred {
    Event* event = nullptr;
    std::function<void()> on_abandon;
  };
  std::array<Deferred, kMaxDeferred> deferred_;
  std::size_t deferred_count_ = 0;
};

}  // namespace gpubox::device
