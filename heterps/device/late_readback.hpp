// LateReadback: values a step computes on the card that the host reads a few steps late, without
// waiting for the card (issue 31: zero host waits in the steady step). A ring of `depth` pinned
// slots of `width` elements, each with an event recorded after the step's copies into it:
//
//   Slot slot = ring.begin(check);   // the slot `depth` steps old is retired first
//   ring.copy_on_card(stream, {{on_card, offset, bytes}, ...});   // into the slot, enqueued
//   *slot.tag = {pass, step, ...};   // what the host knows of the step (named in errors)
//   ring.commit(stream);             // the event, after the copies
//   ...
//   ring.drain(check);               // before a save, the end of a pass, an evaluation's end
//
// The slot is chosen on the card (issue 31, item 3: one step graph replayed every step): the card
// keeps the ring's slot counter, and copy_on_card enqueues one kernel that copies its segments
// into slot (counter % depth) and advances the counter. So a captured step that holds the copy
// writes the right slot at every replay, with nothing baked in but the ring's base; an owner's
// larger per-slot values (an evaluation's predictions) go the same way into blocks of its own
// (copy_to_slot_block, chosen by the same counter). Every
// begin()..commit() calls copy_on_card exactly once (with no segments when the step copies
// nothing into its slot), so the card's counter always names the slot begin() handed out.
// Inside a ComposedStep (composed_step.hpp) that replays, copy_on_card enqueues nothing (the
// step's graph holds it) and commit's event is recorded after the graph's launch. The pinned
// slots (and buffers kept per slot, Slot::index) may still be written by the host directly for a
// step that runs eagerly.
//
// A slot is retired (check(const Tag&, const T* values) sees its values) when it is needed
// again, `depth` steps later, or by drain(), oldest first. By then its copies have normally
// completed (Event::ready: no wait); retiring waits only when the host has run `depth` steps
// ahead of the card, the bound of the pipeline. That wait is counted as a pipeline wait
// (DeviceCounts::pipeline_waits), not a host sync: the card still holds the depth - 1 later
// steps' work, so it does not idle for it, and a card slower than its host makes the host pay it
// at most once a step (a GPU does, at a small batch: issue 31's zero host waits are round trips).
// That holds for an owner that begins one slot a step, in a ring of depth >= 2 (the
// constructor refuses 1: each step would wait for the one before it, a round trip). drain()
// retires the slots already passed, then waits once, a host sync, for the newest slot's event
// (the card's work ends there) and retires the rest without waiting; discard()'s waits are host
// syncs too (SlotWaitReason, late_readback_types.hpp).
// The wait goes through the owner's SlotWait when it gave one: the slot's step ran collectives,
// which a peer that never joins them would leave pending forever, so the owner's communicator
// bounds it (comm::Communicator::wait_for: it fails naming the card, the pass and step, and what
// it waited for; discard()'s wait outlasts an abort); else Event::synchronize. On the cpu
// backend the copies complete when enqueued: retiring never waits. A check that throws leaves its
// slot retired and the later ones pending (discard() forgets them, and the card's counter is set
// back to slot 0 before the next copy_on_card, outside any capture: begin() does it, or resync()).
// Every pinned slot, event and the card counter are made by the constructor: begin, copy_on_card,
// commit, drain allocate nothing.
//
// Thread-safety: none; the card's thread. Move-only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <utility>
#include <vector>

#include "common/error.hpp"
#include "heterps/device/card.hpp"
#include "heterps/device/composed_step.hpp"
#include "heterps/device/late_readback_types.hpp"
#include "heterps/device/memory.hpp"
#include "heterps/device/step_graph.hpp"
#include "heterps/device/stream.hpp"

namespace gpubox::device {

// Bytes of card memory copied into a ring slot: `bytes` from `from` to the slot's byte `offset`
// (whole aligned 4-byte words).
struct RingSegment {
  const void* from = nullptr;
  std::size_t offset = 0;
  std::size_t bytes = 0;
};
inline constexpr std::size_t kMaxRingSegments = 3;
// The deepest ring whose slots may have blocks of their own (copy_to_slot_block).
inline constexpr std::size_t kMaxRingDepth = 8;

namespace detail {
// late_readback.cu: one kernel that copies `segments` into slot (*counter % depth) of `slots`
// (pinned, depth x slot_bytes) and advances *counter (card memory); and *counter = value.
void copy_into_ring_slot(const Stream& stream, void* slots, std::size_t slot_bytes,
                         std::size_t depth, uint64_t* counter, const RingSegment* segments,
                         std::size_t count);
// One kernel: `bytes` (whole aligned 4-byte words) of card memory `from` into
// blocks[*counter % depth] (pinned, `depth` of them), the counter left as it is.
void copy_into_ring_block(const Stream& stream, void* const* blocks, std::size_t depth,
                          const uint64_t* counter, const void* from, std::size_t bytes);
void set_ring_counter(const Stream& stream, uint64_t* counter, uint64_t value);
}  // namespace detail

template <class T, class Tag>
class LateReadback {
 public:
  struct Slot {
    T* host = nullptr;      // `width` elements, pinned: the destination of the step's copies
    Tag* tag = nullptr;     // the step's host-side facts
    std::size_t index = 0;  // the slot's place in the ring (for buffers kept beside it)
  };

  // The wait for a slot whose copies have not completed (Event::ready false), given the slot's
  // event and tag; it returns once the event has passed (counting one host wait, as
  // counted_as(reason) says) or throws. SlotWaitReason::kDiscard: discard()'s wait, which must
  // outlast an abort of the owner's group (there). kRingFull's wait is a pipeline wait, not a
  // round trip, only as the owner uses the ring: one begin() (or make_room() then begin()) a
  // step, so the card still holds the depth - 1 later steps' work when the host waits.
  using SlotWait = std::function<void(const Event& event, const Tag& tag, SlotWaitReason reason)>;

  // `wait` may be empty: Event::synchronize, unbounded (an owner whose steps run no collective).
  LateReadback(Card& card, std::size_t depth, std::size_t width, SlotWait wait = {})
      : wait_(std::move(wait)),
        width_(width),
        host_(depth * width),
        tags_(depth),
        stream_(&card.stream()),
        counter_(card.make_buffer<uint64_t>(1)) {
    GPUBOX_EXPECTS(depth >= 2 && width >= 1, "LateReadback: depth ", depth, ", width ", width,
                   " (a ring of at least 2 slots: with 1, each step waits for the one before)");
    events_.reserve(depth);
    for (std::size_t i = 0; i < depth; ++i) {
      events_.emplace_back(card.device(), card.stream().counters(), EventTiming::kOff,
                           EventReader::kHost);
    }
    const DeviceGuard guard(card.device());  // made on any thread (the kernel: on the card)
    detail::set_ring_counter(*stream_, counter_.data(), 0);
  }

  std::size_t depth() const { return tags_.size(); }
  std::size_t width() const { return width_; }
  std::size_t pending() const { return pending_; }

  // The next slot, after retiring the step that last used it (when the ring is full).
  template <class Check>
  Slot begin(Check&& check) {
    GPUBOX_EXPECTS(!open_, "LateReadback: begin twice without commit");
    resync();
    if (pending_ == depth()) retire_oldest(check, SlotWaitReason::kRingFull);
    const std::size_t at = (oldest_ + pending_) % depth();
    open_ = true;
    copied_ = false;
    return Slot{host_.data() + at * width_, &tags_[at], at};
  }
  // Retires the oldest slot when the ring is full (and sets the card's counter back after a
  // discard()), so that the next begin() neither reads a slot nor enqueues: for an owner whose
  // begin() runs inside a capture, where the host may not query the slot's event.
  template <class Check>
  void make_room(Check&& check) {
    GPUBOX_EXPECTS(!open_, "LateReadback: make_room with a slot open");
    resync();
    if (pending_ == depth()) retire_oldest(check, SlotWaitReason::kRingFull);
  }
  // The step's copies into its slot, as one kernel on `stream` that also advances the card's
  // slot counter (see above); exactly once between begin() and commit(). Enqueues nothing while
  // a ComposedStep replays on `stream` (its graph holds the kernel).
  void copy_on_card(const Stream& stream, std::initializer_list<RingSegment> segments) {
    GPUBOX_EXPECTS(open_ && !copied_, "LateReadback: copy_on_card ",
                   open_ ? "twice in one slot" : "without begin");
    copied_ = true;
    if (!ComposedStep::enqueues(stream)) return;
    detail::copy_into_ring_slot(stream, host_.data(), width_ * sizeof(T), depth(), counter_.data(),
                                segments.begin(), segments.size());
  }
  // Besides the slot's record, `count` elements of card memory `from` into the caller's own
  // pinned block of the open slot: blocks[i] is slot i's (Slot::index), each of at least `count`
  // elements. The block is chosen on the card by the counter copy_on_card advances, so a captured
  // step writes the right block at every replay with nothing baked in but the blocks' addresses
  // (one graph for every slot, not one per slot). Between begin() and copy_on_card; nothing for
  // count 0. Enqueues nothing while a ComposedStep replays on `stream` (its graph holds it).
  template <class U>
  void copy_to_slot_block(const Stream& stream, U* const* blocks, const U* from,
                          std::size_t count) {
    static_assert(sizeof(U) % sizeof(uint32_t) == 0, "whole 4-byte words");
    GPUBOX_EXPECTS(
        open_ && !copied_, "LateReadback: copy_to_slot_block ",
        open_ ? "after copy_on_card (the card's counter names the next slot)" : "without begin");
    if (count == 0 || !ComposedStep::enqueues(stream)) return;
    void* targets[kMaxRingDepth] = {};
    GPUBOX_EXPECTS(depth() <= kMaxRingDepth, "LateReadback: blocks of ", depth(),
                   " slots (at most ", kMaxRingDepth, ")");
    for (std::size_t i = 0; i < depth(); ++i) targets[i] = blocks[i];
    detail::copy_into_ring_block(stream, targets, depth(), counter_.data(), from,
                                 count * sizeof(U));
  }
  // Records the event of the slot begin() returned, after the caller's copies into it (inside a
  // ComposedStep: at its finish, after the graph's launch).
  void commit(const Stream& stream) {
    GPUBOX_EXPECTS(open_, "LateReadback: commit without begin");
    GPUBOX_EXPECTS(copied_,
                   "LateReadback: commit without copy_on_card (the card's slot counter "
                   "would fall behind the host's)");
    Event& event = events_[(oldest_ + pending_) % depth()];
    if (ComposedStep* step = ComposedStep::open_on(stream)) {
      step->defer_record(event, [this] { discard(); });
    } else if (const StepGraph* graph = stream.capturing()) {
      // The host reads the slot's event, which replays would not mark: refused here, naming
      // the graph, rather than when the slot is retired `depth` steps later.
      GPUBOX_FAIL("LateReadback::commit on card ", stream.device(),
                  "'s stream inside the capture of step graph '", graph->name(),
                  "': commit after the capture ends, on the stream the graph is replayed on");
    } else {
      event.record(stream);
    }
    open_ = false;
    ++pending_;
  }
  // Retires every committed slot, oldest first: those whose copies have completed, then, when
  // any is left, after one wait (a host sync) for the newest slot's event, the rest (the events
  // of one stream pass in order: no further wait; one recorded on another stream still waits,
  // counted). The slots already passed are checked before the wait, so a check's failure is
  // reported rather than a wait behind it that a peer never ends.
  template <class Check>
  void drain(Check&& check) {
    while (pending_ > 0 && events_[oldest_].ready()) retire_oldest(check, SlotWaitReason::kDrain);
    if (pending_ == 0) return;
    wait_for_slot((oldest_ + pending_ - 1) % depth(), SlotWaitReason::kDrain);
    while (pending_ > 0) retire_oldest(check, SlotWaitReason::kDrain);
  }
  // Forgets every pending slot (after a failure: nothing more will be checked), once their
  // copies are done: the next begin() hands slot 0 out again, and its caller rewrites the pinned
  // memory an earlier copy may still be reading (or the ring is destroyed and frees it). The
  // waits are the SlotWait's for SlotWaitReason::kDiscard: they outlast an abort of the group,
  // which the failure being handled (a peer's, or this card's) may have raised while the copies
  // still wait behind its collectives (NCCL's abort makes those return, and the copies then run),
  // but not its timeout. A wait that fails (the timeout passed, or the card reports an error)
  // gives that slot and the later ones up unwaited, as waiting for each would run out the
  // timeout again: their copies may then still be queued behind a collective that nothing ended,
  // to write pinned memory that the next begin() hands out (a job whose group timed out begins
  // no more steps) or that the ring's destructor frees (free_pinned: only cudaFreeHost's
  // implicit, undocumented wait for the device stands between the two). The failure being
  // handled is the one reported, not the wait's.
  void discard() {
    for (std::size_t i = 0; i < pending_; ++i) {
      try {
        synchronize_slot((oldest_ + i) % depth(), SlotWaitReason::kDiscard);
      } catch (...) {
        break;
      }
    }
    oldest_ = 0;
    pending_ = 0;
    open_ = false;
    resync_ = true;
  }
  // After discard(): sets the card's slot counter back to slot 0 (one kernel, enqueued), as
  // begin() does itself; for an owner whose next begin() may run inside a capture (HeterComm's
  // checks: before a pass's steps). Nothing when the counter is in step. Refused while capturing.
  void resync() {
    if (!resync_) return;
    GPUBOX_EXPECTS(!detail::thread_capturing(),
                   "LateReadback: the first slot after a discard() is begun inside a step graph's "
                   "capture, where the card's slot counter cannot be set back: resync() first");
    detail::set_ring_counter(*stream_, counter_.data(), 0);
    resync_ = false;
  }

 private:
  template <class Check>
  void retire_oldest(Check& check, SlotWaitReason reason) {
    const std::size_t at = oldest_;
    wait_for_slot(at, reason);  // waits only when the card has not reached the slot's event
    oldest_ = (oldest_ + 1) % depth();
    --pending_;
    check(static_cast<const Tag&>(tags_[at]), static_cast<const T*>(host_.data() + at * width_));
  }

  // Slot `at`'s copies have completed: at once when its event is ready, else through the
  // SlotWait (a throw leaves the slot pending).
  void wait_for_slot(std::size_t at, SlotWaitReason reason) {
    if (!events_[at].ready()) synchronize_slot(at, reason);
  }
  // The wait for slot `at`'s event, counted as `reason` says (the SlotWait's, else
  // Event::synchronize).
  void synchronize_slot(std::size_t at, SlotWaitReason reason) {
    if (wait_) {
      wait_(events_[at], static_cast<const Tag&>(tags_[at]), reason);
    } else {
      events_[at].synchronize(counted_as(reason));
    }
  }

  SlotWait wait_;  // empty: Event::synchronize
  std::size_t width_;
  pinned_buffer<T> host_;
  std::vector<Tag> tags_;
  std::vector<Event> events_;
  const Stream* stream_;             // the card's (the counter's resets)
  device_buffer<uint64_t> counter_;  // card memory: the slots copied into so far (mod depth)
  std::size_t oldest_ = 0;           // the oldest pending slot
  std::size_t pending_ = 0;          // committed, not yet retired
  bool open_ = false;                // begin() returned a slot not yet committed
  bool copied_ = false;              // copy_on_card ran for the open slot
  bool resync_ = false;              // discard() ran: the card's counter must be set back to 0
};

}  // namespace gpubox::device
