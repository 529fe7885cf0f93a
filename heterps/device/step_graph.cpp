#include "heterps/device/step_graph.hpp"

#include <atomic>
#include <cstdlib>
#include <string>

#include "common/error.hpp"
#include "common/error_report.hpp"
#include "heterps/device/cuda_check.hpp"
#include "heterps/device/deferred.hpp"

namespace gpubox::device {
namespace {

// The graph the calling thread captures (CUDA's thread-local capture mode: what this thread
// calls is checked, other threads run as usual).
thread_local StepGraph* t_capture = nullptr;

// Capture serials (StepGraph::capture_serial): 0 means "no capture".
std::atomic<uint64_t> g_last_capture_serial{0};

// Every operation a capture counted is one node of the graph.
uint64_t count_nodes(const DeviceCounts& c) {
  return c.launches + c.pinned_copies + c.pageable_copies + c.card_copies + c.host_copies +
         c.collectives;
}

}  // namespace

#if defined(GPUBOX_BACKEND_CUDA)
struct StepGraph::Native {
  cudaGraphExec_t exec = nullptr;
  ~Native() {
    if (exec != nullptr) cudaGraphExecDestroy(exec);  // a destructor cannot throw
  }
};
#else
struct StepGraph::Native {};
#endif

StepGraph::StepGraph(std::string name)
    : name_(std::move(name)), native_(std::make_unique<Native>()) {}

StepGraph::~StepGraph() { abort_capture(); }

void StepGraph::begin_capture(const Stream& stream) {
  GPUBOX_EXPECTS(t_capture == nullptr, "step graph '", name_,
                 "': begin_capture while this thread captures step graph '",
                 t_capture == nullptr ? "" : t_capture->name(), "'");
  GPUBOX_EXPECTS(stream.capture_ == nullptr, "step graph '", name_, "': card ", stream.device(),
                 "'s stream is already captured by step graph '",
                 stream.capture_ == nullptr ? "" : stream.capture_->name(), "'");
  reset();
#if defined(GPUBOX_BACKEND_CUDA)
  DeviceGuard guard(stream.device());
  GPUBOX_CUDA_TRY(cudaStreamBeginCapture(stream.native(), cudaStreamCaptureModeThreadLocal));
#endif
  stream_ = &stream;
  capture_open_ = true;
  capture_serial_ = g_last_capture_serial.fetch_add(1, std::memory_order_relaxed) + 1;
  refused_ = nullptr;
  recording_base_ = recording_.snapshot();
  stream.capture_ = this;
  stream.capture_counters_ = &recording_;
  t_capture = this;
}

void StepGraph::finish_capture_state() noexcept {
  if (stream_ != nullptr) {
    stream_->capture_ = nullptr;
    stream_->capture_counters_ = nullptr;
  }
  if (t_capture == this) t_capture = nullptr;
  capture_open_ = false;
}

void StepGraph::end_capture() {
  GPUBOX_EXPECTS(capture_open_, "step graph '", name_, "': end_capture without begin_capture");
  const DeviceCounts counted = recording_.snapshot() - recording_base_;
  const char* refused = refused_;
  finish_capture_state();
#if defined(GPUBOX_BACKEND_CUDA)
  DeviceGuard guard(stream_->device());
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(stream_->native(), &graph);
  if (ended != cudaSuccess || refused != nullptr) {
    if (graph != nullptr) cudaGraphDestroy(graph);
    (void)cudaGetLastError();
    if (refused != nullptr) GPUBOX_FAIL(refusal(refused));
    GPUBOX_FAIL("step graph '", name_, "' on card ", stream_->device(),
                ": the capture failed: ", cudaGetErrorString(ended));
  }
  // A new capture of the same work (other pointers or sizes) updates the executable graph in
  // place; a changed topology needs a new one.
  updated_in_place_ = false;
  if (native_->exec != nullptr) {
    cudaGraphExecUpdateResultInfo info{};
    if (cudaGraphExecUpdate(native_->exec, graph, &info) == cudaSuccess) {
      updated_in_place_ = true;
    } else {
      (void)cudaGetLastError();  // cudaErrorGraphExecUpdateFailure is not sticky
      cudaGraphExecDestroy(native_->exec);
      native_->exec = nullptr;
    }
  }
  cudaError_t made = cudaSuccess;
  if (native_->exec == nullptr) made = cudaGraphInstantiate(&native_->exec, graph, 0);
  cudaGraphDestroy(graph);  // the executable graph does not need it
  if (made != cudaSuccess) {
    native_->exec = nullptr;
    GPUBOX_FAIL("step graph '", name_, "' on card ", stream_->device(),
                ": cudaGraphInstantiate failed: ", cudaGetErrorString(made));
  }
#else
  if (refused != nullptr) {
    recorded_.clear();
    GPUBOX_FAIL(refusal(refused));
  }
#endif
  contents_ = counted;
  nodes_ = count_nodes(counted);
  ready_ = true;
  // The capture is over: counters() is the card's again.
  if (CardCounters* counters = stream_->counters()) counters->add_graph_capture();
}

void StepGraph::abort_capture() noexcept {
  if (!capture_open_) return;
  finish_capture_state();
#if defined(GPUBOX_BACKEND_CUDA)
  DeviceGuard guard(stream_->device(), std::nothrow);
  cudaGraph_t graph = nullptr;
  cudaStreamEndCapture(stream_->native(), &graph);
  if (graph != nullptr) cudaGraphDestroy(graph);
  (void)cudaGetLastError();
#endif
  recorded_.clear();
  ready_ = false;
}

void StepGraph::replay(const Stream& stream) {
  GPUBOX_EXPECTS(ready_, "step graph '", name_, "': replay before a capture");
  GPUBOX_EXPECTS(&stream == stream_, "step graph '", name_, "': replayed on card ", stream.device(),
                 "'s stream, captured on another (card ", stream_->device(), ")");
  GPUBOX_EXPECTS(t_capture == nullptr, "step graph '", name_,
                 "': replayed while this thread captures step graph '",
                 t_capture == nullptr ? "" : t_capture->name(), "'");
  if (CardCounters* counters = stream.counters()) {
    counters->add_graph_launch(nodes_,
                               contents_.collectives > 0 ? "a step graph's collectives" : nullptr);
  }
#if defined(GPUBOX_BACKEND_CUDA)
  GPUBOX_CUDA_TRY(cudaGraphLaunch(native_->exec, stream.native()));
#else
  if (stream.deferred() != nullptr && contents_.collectives == 0) {
    // GPUBOX_DEVICE_CHECK=defer: the launch waits in the stream's queue like any work, with the
    // nodes of this capture (a later capture does not change a launch already enqueued).
    auto nodes = std::make_shared<const std::vector<Node> >(recorded_);
    detail::defer(*stream.deferred(), "StepGraph::replay",
                  [nodes, name = name_] { run_nodes(*nodes, name); });
    return;
  }
  // A graph holding collectives meets the peers' threads: it runs now, in the stream's order.
  detail::run_deferred(stream);
  run_nodes(recorded_, name_);
#endif
}

#if !defined(GPUBOX_BACKEND_CUDA)
void StepGraph::run_nodes(const std::vector<Node>& nodes, const std::string& name) {
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    try {
      nodes[i].work();
    } catch (const Error& e) {
      throw_with_context(
          ::gpubox::detail::concat("step graph '", name, "', node ", i, " (", nodes[i].what, "): "),
          e);
    }
  }
}
#endif

void StepGraph::reset() {
  GPUBOX_EXPECTS(!capture_open_, "step graph '", name_, "': reset while capturing");
  recorded_.clear();
  ready_ = false;
  nodes_ = 0;
  contents_ = DeviceCounts{};
}

void StepGraph::record(const char* what, std::function<void()> work) {
  recorded_.push_back(Node{what, std::move(work)});
}

std::string StepGraph::refusal(const char* operation) const {
  return ::gpubox::detail::concat(
      operation, " while capturing step graph '", name_, "' on card ",
      stream_ == nullptr ? -1 : stream_->device(),
      ": a captured step may not wait for the card, allocate or free memory, copy through "
      "pageable memory or call Thrust (heterps/device/step_graph.hpp)");
}

void StepGraph::note_refusal(const char* operation) noexcept {
  if (refused_ == nullptr) refused_ = operation;
}

#if !defined(GPUBOX_BACKEND_CUDA)
void Stream::record(const char* what, std::function<void()> work) const {
  if (capture_ != nullptr) {
    capture_->record(what, std::move(work));
    return;
  }
  GPUBOX_EXPECTS(deferred_ != nullptr, what,
                 " recorded on a stream that neither captures nor defers");
  detail::defer(*deferred_, what, std::move(work));
}
#endif

bool step_graphs_enabled() {
  const char* value = std::getenv("GPUBOX_STEP_GRAPHS");
  return value == nullptr || std::string(value) != "0";
}

namespace detail {

void refuse_while_capturing(const char* operation, const Stream* stream) {
  StepGraph* graph = t_capture;
  if (graph == nullptr && stream != nullptr) graph = stream->capturing();
  if (graph != nullptr) GPUBOX_FAIL(graph->refusal(operation));
}

void note_while_capturing(const char* operation) noexcept {
  if (t_capture != nullptr) t_capture->note_refusal(operation);
}

bool thread_capturing() noexcept { return t_capture != nullptr; }

uint64_t capture_serial_of(const Stream& stream) noexcept {
  const StepGraph* graph = stream.capturing();
  return graph == nullptr ? 0 : graph->capture_serial();
}

void check_event_wait(const Stream& stream, const Event& event) {
  const StepGraph* graph = stream.capturing();
  const uint64_t recorded_in = event.capture_serial();
  if (graph != nullptr) {
    if (recorded_in == graph->capture_serial()) return;  // an edge inside the graph
    GPUBOX_FAIL(graph->refusal(recorded_in == 0
                                   ? "Stream::wait (an event wait) for an event recorded outside "
                                     "the capture (CUDA: cudaErrorStreamCaptureIsolation)"
                                   : "Stream::wait (an event wait) for an event recorded in "
                                     "another capture"),
                "; an event wait inside a capture may only wait for an event recorded in the same "
                "capture");
  }
  if (recorded_in == 0) return;  // eager on both sides
  const StepGraph* open = t_capture;
  const bool forks = open != nullptr && open->capture_serial() == recorded_in;
  GPUBOX_FAIL("Stream::wait (an event wait) on card ", stream.device(),
              "'s stream, which is not captured, for an event recorded inside ",
              forks ? "the open capture of step graph '" + open->name() + "'"
                    : std::string("another thread's or an ended capture"),
              ": a stream outside a capture may not wait for an event recorded inside one (CUDA "
              "would pull the stream into the capture, a fork the device layer does not hold; "
              "once the capture ended, replays do not mark the event)");
}

}  // namespace detail
}  // namespace gpubox::device
