// StepGraph: a card's recurring work captured once and replayed as one launch (a CUDA graph), so a
// training step whose shapes are fixed costs one graph launch instead of tens of kernel launches.
//
//   device::StepGraph graph("dense step");
//   graph.capture(stream, [&] { model.forward_backward_async(...); comm.all_reduce_sum(...); });
//   graph.replay(stream);            // runs what was captured; again every later step
//
// CUDA: cudaStreamBeginCapture (thread-local mode) ... cudaStreamEndCapture, then the executable
// graph is made once (cudaGraphInstantiate) and updated in place by a later capture when its
// topology allows (cudaGraphExecUpdate: new pointers or sizes), else made again; replay is one
// cudaGraphLaunch. NCCL collectives are captured with the rest (NCCL >= 2.9).
// cpu backend: the same structure. While a stream captures, every operation enqueued on it
// through the device layer (parallel_for, memset, card and pinned copies, GEMMs, collectives:
// device::enqueue) is recorded, not run; replay runs the recorded operations in order on the
// calling thread, exactly as eager execution would have: replay equals eager bit for bit.
//
// What a captured step may not contain, on both backends (each throws gpubox::Error naming the
// operation and the graph, and the capture is abandoned): a host wait (Stream/Event synchronize,
// Communicator::synchronize, a blocking collective, a blocking readback), a card or pinned
// allocation (CardMemory, allocate_pinned, scratch arena growth), a pageable copy, and a Thrust
// call (the cpu backend cannot record one), and, as CUDA's capture rules, a Stream::wait for an
// event not recorded in the same capture (nor may a stream outside the capture wait for one
// recorded in it, and the host may not read an event last recorded in a capture: replays do not
// mark it). A free during a capture cannot throw (destructors): the capture fails at
// end_capture naming it.
//
// Values baked in: a capture records kernel arguments, pointers and sizes as they were when it
// ran (CUDA does the same). Whoever replays a graph must know that they still hold: the same
// buffers (no reallocation since: compare DeviceCounts allocations/frees), the same sizes, the
// same host scalars; device-side values (a step count on the card) are read at replay.
//
// Counting (counters.hpp): the operations enqueued while capturing count into the graph
// (contents()), not into the card; each replay counts one graph launch and nodes() graph nodes
// on the card, and each completed capture one graph capture (graph_captures). So a step's
// DeviceCounts say what ran outside graphs (launches, copies, collectives), what ran inside them
// (graph_launches, graph_nodes), and whether a graph was captured again (graph_captures).
//
// Thread-safety: one card's thread captures and replays a graph; the capture is thread-local
// (another card's thread captures its own graph at the same time).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "heterps/device/counters.hpp"
#include "heterps/device/stream.hpp"

namespace gpubox::device {

class StepGraph {
 public:
  // `name` appears in every error about the graph ("dense step").
  explicit StepGraph(std::string name);
  ~StepGraph();
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;

  // Starts capturing `stream` from the calling thread. Throws when this thread already captures
  // a graph or the stream is already captured.
  void begin_capture(const Stream& stream);
  // Ends the capture: the graph now holds the work enqueued since begin_capture (replacing an
  // earlier capture's). Throws, leaving the graph empty, when a forbidden free happened while
  // capturing or (CUDA) the capture was invalidated.
  void end_capture();
  // Abandons a capture in progress (after an error): the stream runs eagerly again, the graph is
  // empty. No-op when not capturing.
  void abort_capture() noexcept;
  // begin_capture(stream); fn(); end_capture() — abort_capture() and rethrow when fn throws.
  template <class Fn>
  void capture(const Stream& stream, Fn&& fn) {
    begin_capture(stream);
    try {
      std::forward<Fn>(fn)();
    } catch (...) {
      abort_capture();
      throw;
    }
    end_capture();
  }

  // Runs the captured work on `stream` (the stream it was captured on), enqueued like any other
  // work (CUDA: asynchronous). Counts one graph launch of nodes() nodes on the stream's card.
  // Throws when nothing was captured or the thread is capturing.
  void replay(const Stream& stream);
  // Drops the captured work (CUDA: keeps the executable graph for a later in-place update).
  void reset();

  const std::string& name() const { return name_; }
  bool ready() const { return ready_; }
  bool capturing() const { return capture_open_; }
  // Which capture this graph's last (or open) begin_capture started: unique among every graph's
  // captures in the process, never 0 (0: never captured). Events recorded in it carry it.
  uint64_t capture_serial() const { return capture_serial_; }
  // Operations the capture recorded: launches + copies + collectives of contents().
  uint64_t nodes() const { return nodes_; }
  // What the capture enqueued, counted as the card would have counted it eagerly.
  const DeviceCounts& contents() const { return contents_; }
  // CUDA: whether the last end_capture updated the executable graph in place (false: it was
  // instantiated anew). Always false on cpu.
  bool updated_in_place() const { return updated_in_place_; }

  // For Stream::record (cpu backend): appends one operation to the capture.
  void record(const char* what, std::function<void()> work);
  // For detail::refuse_while_capturing / note_while_capturing: the error text for `operation`,
  // and a forbidden free to report at end_capture.
  std::string refusal(const char* operation) const;
  void note_refusal(const char* operation) noexcept;

 private:
  struct Node {
    const char* what;
    std::function<void()> work;
  };
  void finish_capture_state() noexcept;
#if !defined(GPUBOX_BACKEND_CUDA)
  // Runs captured nodes in order; an error names the graph, the node and what it was.
  static void run_nodes(const std::vector<Node>& nodes, const std::string& name);
#endif

  std::string name_;
  const Stream* stream_ = nullptr;  // captured (or being captured) on
  bool capture_open_ = false;
  bool ready_ = false;
  uint64_t nodes_ = 0;
  DeviceCounts contents_;
  CardCounters recording_;         // what captures count (Stream::counters while capturing)
  DeviceCounts recording_base_;    // recording_ when the open capture began
  const char* refused_ = nullptr;  // a forbidden free seen while capturing
  bool updated_in_place_ = false;
  uint64_t capture_serial_ = 0;
  std::vector<Node> recorded_;  // cpu backend: the captured operations, in order
  struct Native;                // CUDA: the executable graph
  std::unique_ptr<Native> native_;
};

// Whether step graphs are on: GPUBOX_STEP_GRAPHS=0 runs every step eagerly (to compare, or to
// debug a step graph); read at each call (the trainer's card workers and the card tier's
// HeterComms read it when they are made).
bool step_graphs_enabled();

}  // namespace gpubox::device
