// Per-card accounting of what host code asks of a card: host synchronizations, card allocations,
// host<->card copies (pinned or pageable), kernel launches and collectives. The counting lives in
// the portable wrappers (Stream, CardMemory, copy_bytes_async, parallel_for, exec_policy, the
// Communicator's public methods), never in a backend branch, so the cpu and cuda builds count
// the same things for the same code: a test on the cpu backend pins what a GPU step costs.
//
// Thread-safety: counters are relaxed atomics; the card's own thread increments them, any
// thread may take a snapshot (exact once the card's thread is idle).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

namespace gpubox::device {

// A plain copy of a card's counters (or the difference of two: counts over an interval).
struct DeviceCounts {
  uint64_t host_syncs = 0;  // waits for the card: stream/event synchronize, a blocking
                            // collective (barrier, exchange_counts), Communicator::synchronize,
                            // a Thrust result read on the host (host_result): the card has
                            // nothing left queued once it returns (a round trip)
  // Waits for a step `depth` steps back: a late readback's ring was full and its oldest slot's
  // copies had not completed (LateReadback::begin, make_room; HostWait::kPipeline). The host ran
  // that far ahead of the card, which still holds the later steps' work, so it does not idle for
  // the wait: the pipeline's bound (flow control), not a round trip. At most one a step per ring
  // on a card slower than its host; 0 on the cpu backend, whose card has run a step's work when
  // its enqueue returns. Not a synchronization of the card: the collective window stays open.
  uint64_t pipeline_waits = 0;
  uint64_t allocations = 0;  // CardMemory::allocate calls (card memory)
  uint64_t frees = 0;        // CardMemory::deallocate calls (card memory)
  // allocate_pinned / free_pinned calls on the card's host thread (cudaMallocHost and
  // cudaFreeHost synchronize the device: a peer's collective may be waiting for this card).
  // Counted on the card the calling thread was last bound to (Card::activate).
  uint64_t pinned_allocations = 0;
  uint64_t pinned_frees = 0;
  uint64_t pinned_copies = 0;    // host<->card copies whose host side is pinned (allocate_pinned)
  uint64_t pageable_copies = 0;  // host<->card copies from or to pageable host memory
  uint64_t card_copies = 0;      // card<->card copies (same card or a peer)
  uint64_t host_copies = 0;      // host<->host copies through the device API
  // Copies enqueued on a card's copy stream (Card::copy_stream): they overlap the compute
  // stream's work. Counted in the fields above by kind too.
  uint64_t copy_stream_copies = 0;
  // Stream::wait: one of the card's streams waits for an event of another (the card orders the
  // work; the host does not wait).
  uint64_t stream_waits = 0;
  uint64_t launches = 0;     // parallel_for kernels, memsets, Thrust calls, GEMMs/GEMVs
  uint64_t collectives = 0;  // communicator collectives enqueued or run
  // Step graphs (step_graph.hpp): replays, and the operations they ran (launches, copies and
  // collectives recorded by the capture). Work inside a replayed graph is counted here only,
  // never in launches, copies or collectives above: those count what the host enqueued itself.
  uint64_t graph_launches = 0;
  uint64_t graph_nodes = 0;
  // Step graph captures completed (StepGraph::end_capture) on the card's stream: a steady step
  // replays, so a capture there means something a graph bakes in changed (its owner decides).
  uint64_t graph_captures = 0;
  // Allocations made while a collective was enqueued and not yet synchronized (device rule 1
  // in card.hpp): must stay 0.
  uint64_t window_allocations = 0;

  DeviceCounts operator-(const DeviceCounts& earlier) const;
  DeviceCounts& operator+=(const DeviceCounts& other);
};

// Every field of DeviceCounts with its name, in declaration order (one list for arithmetic,
// snapshots and messages).
using DeviceCountMember = uint64_t DeviceCounts::*;
struct DeviceCountField {
  const char* name;
  DeviceCountMember field;
};
inline constexpr DeviceCountField kDeviceCountFields[] = {
    {"host_syncs", &DeviceCounts::host_syncs},
    {"pipeline_waits", &DeviceCounts::pipeline_waits},
    {"allocations", &DeviceCounts::allocations},
    {"frees", &DeviceCounts::frees},
    {"pinned_allocations", &DeviceCounts::pinned_allocations},
    {"pinned_frees", &DeviceCounts::pinned_frees},
    {"pinned_copies", &DeviceCounts::pinned_copies},
    {"pageable_copies", &DeviceCounts::pageable_copies},
    {"card_copies", &DeviceCounts::card_copies},
    {"host_copies", &DeviceCounts::host_copies},
    {"copy_stream_copies", &DeviceCounts::copy_stream_copies},
    {"stream_waits", &DeviceCounts::stream_waits},
    {"launches", &DeviceCounts::launches},
    {"collectives", &DeviceCounts::collectives},
    {"graph_launches", &DeviceCounts::graph_launches},
    {"graph_nodes", &DeviceCounts::graph_nodes},
    {"graph_captures", &DeviceCounts::graph_captures},
    {"window_allocations", &DeviceCounts::window_allocations},
};

// "host_syncs 3, allocations 0, ..." for messages and logs.
std::string to_string(const DeviceCounts& counts);

// How a host wait is counted. kSync: a host synchronization (host_syncs). kPipeline: a wait for
// the oldest step of a late readback's full ring (pipeline_waits).
enum class HostWait { kSync, kPipeline };

// One card's live counters, plus the open collective window of device rule 1: from a
// collective's enqueue to the next synchronization of the card.
class CardCounters {
 public:
  CardCounters() = default;
  CardCounters(const CardCounters&) = delete;
  CardCounters& operator=(const CardCounters&) = delete;

  void add_host_sync() {
    bump(host_syncs_);
    window_ = nullptr;  // every enqueued collective has completed
  }
  // Later steps' collectives may still run: the window stays as it is.
  void add_pipeline_wait() { bump(pipeline_waits_); }
  void add_host_wait(HostWait counted_as) {
    if (counted_as == HostWait::kPipeline) {
      add_pipeline_wait();
    } else {
      add_host_sync();
    }
  }
  // `collective` names it (a string literal) for rule-1 messages; non-blocking collectives open
  // the window, blocking ones (which return complete) do not.
  void add_collective(const char* collective, bool blocking) {
    bump(collectives_);
    if (!blocking) window_ = collective;
  }
  // Returns the collective whose window is open (nullptr when none): the caller decides whether
  // an allocation there is fatal (GPUBOX_DEVICE_CHECK) or only counted.
  const char* add_allocation() {
    bump(allocations_);
    if (window_ != nullptr) bump(window_allocations_);
    return window_;
  }
  void add_free() { bump(frees_); }
  void add_pinned_allocation() { bump(pinned_allocations_); }
  void add_pinned_free() { bump(pinned_frees_); }
  void add_pinned_copy() { bump(pinned_copies_); }
  void add_pageable_copy() { bump(pageable_copies_); }
  void add_card_copy() { bump(card_copies_); }
  void add_host_copy() { bump(host_copies_); }
  void add_copy_stream_copy() { bump(copy_stream_copies_); }
  void add_stream_wait() { bump(stream_waits_); }
  void add_launches(uint64_t n = 1) { launches_.fetch_add(n, std::memory_order_relaxed); }
  // One replay of a step graph holding `nodes` operations; `collective` (a string literal) opens
  // the rule-1 window when the graph holds collectives (they are in flight after the launch, as
  // an enqueued one is), nullptr when it holds none.
  void add_graph_launch(uint64_t nodes, const char* collective = nullptr) {
    bump(graph_launches_);
    graph_nodes_.fetch_add(nodes, std::memory_order_relaxed);
    if (collective != nullptr) window_ = collective;
  }
  void add_graph_capture() { bump(graph_captures_); }

  DeviceCounts snapshot() const;

 private:
  static void bump(std::atomic<uint64_t>& counter) {
    counter.fetch_add(1, std::memory_order_relaxed);
  }

  std::atomic<uint64_t> host_syncs_{0};
  std::atomic<uint64_t> pipeline_waits_{0};
  std::atomic<uint64_t> allocations_{0};
  std::atomic<uint64_t> frees_{0};
  std::atomic<uint64_t> pinned_allocations_{0};
  std::atomic<uint64_t> pinned_frees_{0};
  std::atomic<uint64_t> pinned_copies_{0};
  std::atomic<uint64_t> pageable_copies_{0};
  std::atomic<uint64_t> card_copies_{0};
  std::atomic<uint64_t> host_copies_{0};
  std::atomic<uint64_t> copy_stream_copies_{0};
  std::atomic<uint64_t> stream_waits_{0};
  std::atomic<uint64_t> launches_{0};
  std::atomic<uint64_t> collectives_{0};
  std::atomic<uint64_t> graph_launches_{0};
  std::atomic<uint64_t> graph_nodes_{0};
  std::atomic<uint64_t> graph_captures_{0};
  std::atomic<uint64_t> window_allocations_{0};
  // Touched only by the card's own thread (the one enqueueing and synchronizing).
  const char* window_ = nullptr;
};

// The counters that pinned allocations and frees made by the calling thread count into (null:
// none). Card::activate sets them to its card's, so a card thread's pinned buffers are counted
// on its card whichever object makes them.
void set_thread_pinned_counters(CardCounters* counters);
CardCounters* thread_pinned_counters();

}  // namespace gpubox::device
