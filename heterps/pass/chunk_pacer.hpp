// ChunkPacer: how many keys the next chunk of the next pass's card work takes (NextPassWork), so
// that a chunk costs the card about a set fraction of a training step (issue 31, item 4). A
// chunk runs on the card's stream between two steps: on a GPU, where a step takes well under a
// millisecond, a chunk sized by key count for the CPU (16-33 ms) would stall the next step for
// dozens of steps' time. The pacer takes each chunk's measured card time and the step's beside
// it (timing events, NextPassWork) and aims the next chunk at `step_fraction` of the step, at
// most doubling or halving a chunk at a time (the times are noisy), within
// [kMinKeys, max_keys]. With step_fraction 0 every chunk takes max_keys (the cpu build's
// default: there a chunk and a step share the card thread, and the key count is the knob).
//
// Thread-safety: none; one card's thread.
#pragma once

#include <algorithm>
#include <cstddef>
#include <optional>

namespace gpubox::pass {

class ChunkPacer {
 public:
  static constexpr std::size_t kMinKeys = 256;
  static constexpr std::size_t kStartKeys = 4096;  // before anything is measured

  ChunkPacer() = default;
  ChunkPacer(std::size_t max_keys, double step_fraction)
      : max_(max_keys),
        fraction_(step_fraction),
        keys_(step_fraction > 0 ? std::min(max_keys, kStartKeys) : max_keys) {}

  // Keys (or the phase's unit of them) of the next chunk.
  std::size_t keys() const { return keys_; }
  bool paced() const { return fraction_ > 0; }

  // A chunk of `keys` took `chunk_seconds` of card time; the step beside it `step_seconds`.
  // Measures that are not positive are ignored.
  void observe(std::size_t keys, double chunk_seconds, double step_seconds) {
    if (!paced() || keys == 0 || !(chunk_seconds > 0) || !(step_seconds > 0)) return;
    const double wanted = static_cast<double>(keys) * fraction_ * step_seconds / chunk_seconds;
    const double now = static_cast<double>(keys_);
    const double bounded = std::clamp(wanted, now / 2, now * 2);
    const std::size_t floor = std::min(kMinKeys, max_);
    keys_ = std::clamp(static_cast<std::size_t>(bounded), floor, max_);
  }

 private:
  std::size_t max_ = 0;
  double fraction_ = 0;
  std::size_t keys_ = 0;
};

// ChunkChain: the chunks of the next pass's card work in flight on one card's stream, oldest
// first, and the bookkeeping that turns their timing events into the pacer's measures (issue 31,
// item 4). On a GPU the host runs steps ahead of the card: a chunk's results (a look-up's rows)
// come back several steps after it was enqueued, so with one chunk in flight the work advanced
// once every few steps. The chain keeps up to `depth` chunks in flight (each in its own scratch
// slot) and is read oldest first, so a chunk can start at every step.
//
// Timing: every chunk is bracketed by a begin and an end event (the caller's: NextPassWork
// holds depth + 1 of each, indexed by Chunk::event, so the end of the chunk before the oldest
// one in flight is still intact when the oldest is read). The card time between the end of the
// chunk before and the begin of this one is the steps enqueued between them: `steps_before`
// polls (one poll per step, whether it started a chunk or not: a poll that finds the chain full
// or its results not back yet does not break the chain; the gap is shared among its steps).
//
// Pure: no device call. The caller asks for a chunk (start), records the events, and later,
// once the oldest chunk's end has passed, hands its measured times to retire().
//
// Thread-safety: none; one card's thread.
class ChunkChain {
 public:
  // The trainer reads a step's status 4 steps late (card_worker.cpp, kStatusDepth), so its host
  // runs up to about 4 steps ahead of the card: a chunk enqueued after step s has passed by the
  // poll after step s + 5 at the latest, and 5 in flight let a chunk start at every step.
  static constexpr std::size_t kDepth = 5;
  static constexpr std::size_t kMaxDepth = 8;

  struct Chunk {
    std::size_t slot = 0;          // [0, depth): the chunk's scratch region
    std::size_t event = 0;         // [0, depth + 1): its begin and end events
    std::size_t keys = 0;          // its size
    std::size_t steps_before = 0;  // polls since the chunk before it started; 0: none before
  };
  // A retired chunk's card times: from its begin event to its end event, and from the end event
  // of the chunk before (previous_event) to its begin event.
  struct Times {
    double chunk_seconds = 0;
    double since_previous_seconds = 0;
  };

  ChunkChain() = default;
  // `depth` within [1, kMaxDepth].
  ChunkChain(ChunkPacer pacer, std::size_t depth)
      : pacer_(pacer), depth_(std::clamp<std::size_t>(depth, 1, kMaxDepth)) {}

  const ChunkPacer& pacer() const { return pacer_; }
  std::size_t depth() const { return depth_; }
  std::size_t in_flight() const { return count_; }
  bool full() const { return count_ == depth_; }
  // The chunks in flight, oldest first (i < in_flight()).
  const Chunk& oldest() const { return chunks_[first_]; }
  const Chunk& newest() const { return chunks_[(first_ + count_ - 1) % kMaxDepth]; }
  // The end event of the chunk started before `chunk`.
  std::size_t previous_event(const Chunk& chunk) const {
    return (chunk.event + depth_) % (depth_ + 1);
  }

  // One step passed: called once per poll of the work (NextPassWork::prepare), first.
  void poll() {
    if (chained_) ++polls_;
  }
  // A chunk of min(pacer().keys(), left) keys, counted in flight; none when the chain is full or
  // left is 0.
  std::optional<Chunk> start(std::size_t left) {
    const std::size_t keys = std::min(pacer_.keys(), left);
    if (full() || keys == 0) return std::nullopt;
    Chunk chunk;
    chunk.slot = next_slot_;  // FIFO: the slot of the chunk `depth` starts ago, retired
    chunk.event = next_event_;
    chunk.keys = keys;
    chunk.steps_before = chained_ ? polls_ : 0;
    next_slot_ = (next_slot_ + 1) % depth_;
    next_event_ = (next_event_ + 1) % (depth_ + 1);
    chunks_[(first_ + count_) % kMaxDepth] = chunk;
    ++count_;
    chained_ = true;
    polls_ = 0;
    return chunk;
  }
  // The newest chunk did `keys` of work (its start's size, unless the work found less: 0 when it
  // found none, which measures nothing). Needs a chunk in flight.
  void set_newest_keys(std::size_t keys) { chunks_[(first_ + count_ - 1) % kMaxDepth].keys = keys; }
  // The oldest chunk is done and read; `times` (when paced and measured) go to the pacer, the
  // step's time being the gap shared among the steps before the chunk.
  void retire(const std::optional<Times>& times) {
    const Chunk chunk = oldest();
    first_ = (first_ + 1) % kMaxDepth;
    --count_;
    if (times && chunk.steps_before > 0) {
      pacer_.observe(chunk.keys, times->chunk_seconds,
                     times->since_previous_seconds / static_cast<double>(chunk.steps_before));
    }
  }

 private:
  ChunkPacer pacer_;
  std::size_t depth_ = kDepth;
  Chunk chunks_[kMaxDepth];
  std::size_t first_ = 0;
  std::size_t count_ = 0;
  std::size_t next_slot_ = 0;
  std::size_t next_event_ = 0;
  bool chained_ = false;  // a chunk started: the next one measures the steps since
  std::size_t polls_ = 0;
};

}  // namespace gpubox::pass
