// Plain types of device::LateReadback (late_readback.hpp), for code that waits for its slots
// without the ring itself (comm::bounded_slot_wait).
#pragma once

#include "heterps/device/counters.hpp"  // HostWait

namespace gpubox::device {

// Why a LateReadback waits for a slot whose copies have not completed (its SlotWait is told).
enum class SlotWaitReason {
  // begin() / make_room(): the ring is full. The host has run `depth` steps ahead of the card,
  // which still holds the later steps' work: a pipeline wait (HostWait::kPipeline).
  kRingFull,
  // drain(): every pending step is read, the card's work ends with the last: a host sync.
  kDrain,
  // discard(): a failure's cleanup, which outlasts an abort of the owner's group: a host sync.
  kDiscard,
};

// How a slot's wait for `reason` is counted.
constexpr HostWait counted_as(SlotWaitReason reason) {
  return reason == SlotWaitReason::kRingFull ? HostWait::kPipeline : HostWait::kSync;
}

}  // namespace gpubox::device
