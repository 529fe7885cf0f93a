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

}  // namespace gpubox::pass
