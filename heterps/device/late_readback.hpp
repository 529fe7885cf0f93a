// LateReadback: values a step computes on the card that the host reads a few steps late, without
// waiting for the card (issue 31: zero host waits in the steady step). A ring of `depth` pinned
// slots of `width` elements, each with an event recorded after the step's copies into it:
//
//   Slot slot = ring.begin(check);   // the slot `depth` steps old is retired first
//   copy_async(slot.host, on_card, width, stream);   // any copies into slot.host, enqueued
//   *slot.tag = {pass, step, ...};   // what the host knows of the step (named in errors)
//   ring.commit(stream);             // the event, after the copies
//   ...
//   ring.drain(check);               // before a save, the end of a pass, an evaluation's end
//
// A slot is retired (check(const Tag&, const T* values) sees its values) when it is needed
// again, `depth` steps later, or by drain(), oldest first. By then its copies have normally
// completed (Event::ready: no wait); retiring waits only when the host has run `depth` steps
// ahead of the card, the bound of the pipeline, and that wait is counted (Event::synchronize)
// as every host wait is. On the cpu backend the copies complete when enqueued: retiring never
// waits. A check that throws leaves its slot retired and the later ones pending (discard()
// forgets them). Every pinned slot and event is made by the constructor: begin, commit, drain
// allocate nothing.
//
// Thread-safety: none; the card's thread. Move-only.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

#include "common/error.hpp"
#include "heterps/device/card.hpp"
#include "heterps/device/memory.hpp"
#include "heterps/device/step_graph.hpp"
#include "heterps/device/stream.hpp"

namespace gpubox::device {

template <class T, class Tag>
class LateReadback {
 public:
  struct Slot {
    T* host = nullptr;      // `width` elements, pinned: the destination of the step's copies
    Tag* tag = nullptr;     // the step's host-side facts
    std::size_t index = 0;  // the slot's place in the ring (for buffers kept beside it)
  };

  LateReadback(Card& card, std::size_t depth, std::size_t width)
      : width_(width), host_(depth * width), tags_(depth) {
    GPUBOX_EXPECTS(depth >= 1 && width >= 1, "LateReadback: depth ", depth, ", width ", width);
    events_.reserve(depth);
    for (std::size_t i = 0; i < depth; ++i) {
      events_.emplace_back(card.device(), card.stream().counters(), EventTiming::kOff,
                           EventReader::kHost);
    }
  }

  std::size_t depth() const { return tags_.size(); }
  std::size_t width() const { return width_; }
  std::size_t pending() const { return pending_; }

  // The next slot, after retiring the step that last used it (when the ring is full).
  template <class Check>
  Slot begin(Check&& check) {
    GPUBOX_EXPECTS(!open_, "LateReadback: begin twice without commit");
    if (pending_ == depth()) retire_oldest(check);
    const std::size_t at = (oldest_ + pending_) % depth();
    open_ = true;
    return Slot{host_.data() + at * width_, &tags_[at], at};
  }
  // Records the event of the slot begin() returned, after the caller's copies into it. Not inside
  // a step graph's capture: the host reads the event, and replays would not mark it (refused here,
  // naming the graph, rather than when the slot is retired `depth` steps later).
  void commit(const Stream& stream) {
    GPUBOX_EXPECTS(open_, "LateReadback: commit without begin");
    if (const StepGraph* graph = stream.capturing()) {
      GPUBOX_FAIL("LateReadback::commit on card ", stream.device(),
                  "'s stream inside the capture of step graph '", graph->name(),
                  "': the host reads the slot's event, which replays would not mark; commit "
                  "after the capture ends, on the stream the graph is replayed on");
    }
    events_[(oldest_ + pending_) % depth()].record(stream);
    open_ = false;
    ++pending_;
  }
  // Retires every committed slot, oldest first (waits for the card only where a copy has not
  // completed).
  template <class Check>
  void drain(Check&& check) {
    while (pending_ > 0) retire_oldest(check);
  }
  // Forgets every pending slot (after a failure: nothing more will be checked), once their
  // copies are done: the next begin() hands slot 0 out again, and its caller rewrites the pinned
  // memory an earlier copy may still be reading.
  void discard() {
    for (std::size_t i = 0; i < pending_; ++i) {
      try {
        events_[(oldest_ + i) % depth()].synchronize();
      } catch (...) {  // the failure being handled is the one to report
      }
    }
    oldest_ = 0;
    pending_ = 0;
    open_ = false;
  }

 private:
  template <class Check>
  void retire_oldest(Check& check) {
    const std::size_t at = oldest_;
    if (!events_[at].ready()) events_[at].synchronize();  // the host is `depth` steps ahead
    oldest_ = (oldest_ + 1) % depth();
    --pending_;
    check(static_cast<const Tag&>(tags_[at]), static_cast<const T*>(host_.data() + at * width_));
  }

  std::size_t width_;
  pinned_buffer<T> host_;
  std::vector<Tag> tags_;
  std::vector<Event> events_;
  std::size_t oldest_ = 0;   // the oldest pending slot
  std::size_t pending_ = 0;  // committed, not yet retired
  bool open_ = false;        // begin() returned a slot not yet committed
};

}  // namespace gpubox::device
