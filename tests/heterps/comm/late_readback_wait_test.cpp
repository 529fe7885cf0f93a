// The bounded wait for a late readback's slot (Communicator::wait_for, bounded_slot_wait): it
// counts one host wait (a full ring's as a pipeline wait, drain's and discard's as host syncs),
// and a group aborted while the host waits for a step's slot fails naming the step and the wait,
// where Event::synchronize would wait forever for a collective that a peer never joins (NCCL);
// discard()'s wait outlasts the abort (OnAbort::kOutlast).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "heterps/comm/communicator.hpp"
#include "heterps/device/deferred.hpp"
#include "heterps/device/late_readback.hpp"
#include "heterps/device/memory.hpp"
#include "tests/heterps/comm/comm_test_util.hpp"

namespace gpubox::comm {
namespace {

using comm_test::CardGroup;
using ::testing::HasSubstr;

struct Tag {
  int64_t pass = -1;
  int64_t step = -1;
};

// What `wait` threw ("" when it returned).
template <class Wait>
std::string error_of(Wait&& wait) {
  try {
    wait();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(BoundedEventWait, CountsOneHostWaitAndNamesTheStepOnceAborted) {
  CardGroup cg(1);
  cg.run([&](device::Card& card, Communicator& comm) {
    device::Event event(card.device(), card.stream().counters(), device::EventTiming::kOff,
                        device::EventReader::kHost);
    auto words = card.make_buffer<uint32_t>(64);
    device::memset_bytes_async(words.data(), 0, words.bytes(), card.stream());
    event.record(card.stream());
    const uint64_t before = card.counts().host_syncs;
    comm.wait_for(event, "the test's slot");
    EXPECT_EQ(card.counts().host_syncs, before + 1);
    comm.set_step(2, 5);
    cg.group->abort("a peer left");
    const std::string error = error_of([&] { comm.wait_for(event, "the test's slot"); });
    EXPECT_THAT(error, HasSubstr("pass 2, step 5: "));
    EXPECT_THAT(error, HasSubstr("the test's slot"));
    EXPECT_THAT(error, HasSubstr("a peer left"));
    EXPECT_EQ(card.counts().host_syncs, before + 2);  // counted before it waits, as synchronize
    // A failure's cleanup outlasts the abort: the event has passed, so the wait returns.
    EXPECT_EQ(error_of([&] { comm.wait_for(event, "the test's slot", OnAbort::kOutlast); }), "");
    EXPECT_EQ(card.counts().host_syncs, before + 3);
    // Counted as a pipeline wait when asked (a late readback's full ring), and only so.
    const device::DeviceCounts at = card.counts();
    comm.wait_for(event, "the test's slot", OnAbort::kOutlast, device::HostWait::kPipeline);
    const device::DeviceCounts waited = card.counts() - at;
    EXPECT_EQ(waited.pipeline_waits, 1u);
    EXPECT_EQ(waited.host_syncs, 0u);
  });
}

// Streams made while it lives defer their work until a wait demands it (deferred.hpp).
class DeferredStreams {
 public:
  DeferredStreams()
      : was_(device::deferred_execution_enabled()), seed_(device::deferred_execution_seed()) {
    device::set_deferred_execution(true, 0);
  }
  ~DeferredStreams() { device::set_deferred_execution(was_, seed_); }
  DeferredStreams(const DeferredStreams&) = delete;
  DeferredStreams& operator=(const DeferredStreams&) = delete;

 private:
  bool was_;
  uint64_t seed_;
};

// A ring slot whose copy the card has not run when the host comes back to it (deferred streams:
// a card behind its host, as a GPU is at a small batch) is waited for through the communicator:
// one pipeline wait, no host sync (the card still holds the later step's work); with the group
// aborted, the retire fails naming the slot's pass and step, leaves the slot pending, and
// discard() still forgets it, its waits host syncs; drain() waits once, a host sync, for the
// newest slot.
TEST(BoundedEventWait, ALateReadbackSlotWaitsThroughTheCommunicator) {
  GPUBOX_IN_PROCESS_ONLY("deferred streams are the cpu backend's");
  const DeferredStreams defer;
  CardGroup cg(1);
  cg.run([&](device::Card& card, Communicator& comm) {
    auto value = card.make_buffer<uint32_t>(1);
    device::memset_bytes_async(value.data(), 0x5a, value.bytes(), card.stream());
    device::LateReadback<uint32_t, Tag> ring(card, 2, 1,
                                             bounded_slot_wait<Tag>(comm, "the test's status"));
    std::vector<int64_t> retired;
    const auto check = [&](const Tag& tag, const uint32_t*) { retired.push_back(tag.step); };
    std::vector<const uint32_t*> hosts;
    const auto run_step = [&](int64_t step) {
      const auto slot = ring.begin(check);
      hosts.push_back(slot.host);
      *slot.tag = Tag{1, step};
      ring.copy_on_card(card.stream(), {{value.data(), 0, sizeof(uint32_t)}});
      ring.commit(card.stream());
    };
    run_step(0);
    run_step(1);
    const device::DeviceCounts before = card.counts();
    ring.make_room(check);  // step 0's copy is still queued: the wait runs it
    const device::DeviceCounts full = card.counts() - before;
    EXPECT_EQ(full.pipeline_waits, 1u);
    EXPECT_EQ(full.host_syncs, 0u);
    EXPECT_EQ(retired, std::vector<int64_t>({0}));
    run_step(2);
    comm.set_step(1, 3);
    cg.group->abort("a peer left");
    const std::string error = error_of([&] { ring.make_room(check); });
    EXPECT_THAT(error, HasSubstr("pass 1, step 3: "));  // the step the host is at
    EXPECT_THAT(error, HasSubstr("the test's status of pass 1, step 1"));  // the slot's
    EXPECT_THAT(error, HasSubstr("a peer left"));
    EXPECT_EQ(retired, std::vector<int64_t>({0}));
    EXPECT_EQ(ring.pending(), 2u);
    const device::DeviceCounts at_discard = card.counts();
    ring.discard();  // waits for both slots' copies, the abort notwithstanding
    EXPECT_EQ(ring.pending(), 0u);
    const device::DeviceCounts discarded = card.counts() - at_discard;
    EXPECT_EQ(discarded.host_syncs, 2u);
    EXPECT_EQ(discarded.pipeline_waits, 0u);
    EXPECT_EQ(*hosts[2], 0x5a5a5a5au);  // step 2's copy ran before its slot was given up
  });
  // drain(): the end of the steps. The slot already passed is checked first, then one wait, a
  // host sync, for the newest slot (its event passes after the older ones'), and the rest are
  // checked without waiting.
  CardGroup fresh(1);
  fresh.run([&](device::Card& card, Communicator& comm) {
    auto value = card.make_buffer<uint32_t>(1);
    device::memset_bytes_async(value.data(), 0, value.bytes(), card.stream());
    std::vector<std::string> events;
    const auto bounded = bounded_slot_wait<Tag>(comm, "the test's status");
    device::LateReadback<uint32_t, Tag> ring(
        card, 3, 1, [&](const device::Event& event, const Tag& tag, device::SlotWaitReason why) {
          events.push_back("wait " + std::to_string(tag.step));
          bounded(event, tag, why);
        });
    const auto check = [&](const Tag& tag, const uint32_t*) {
      events.push_back("check " + std::to_string(tag.step));
    };
    for (int64_t step = 0; step < 3; ++step) {
      const auto slot = ring.begin(check);
      *slot.tag = Tag{0, step};
      ring.copy_on_card(card.stream(), {{value.data(), 0, sizeof(uint32_t)}});
      ring.commit(card.stream());
      if (step == 0) card.stream().synchronize();  // step 0's copy has run, the others are queued
    }
    const device::DeviceCounts before = card.counts();
    ring.drain(check);
    const device::DeviceCounts drained = card.counts() - before;
    EXPECT_EQ(events, std::vector<std::string>({"check 0", "wait 2", "check 1", "check 2"}));
    EXPECT_EQ(drained.host_syncs, 1u);
    EXPECT_EQ(drained.pipeline_waits, 0u);
    EXPECT_EQ(ring.pending(), 0u);
  });
}

// A ring of one slot would make each step wait for the one before it (a round trip, not a
// pipeline wait): refused.
TEST(BoundedEventWait, ALateReadbackHasAtLeastTwoSlots) {
  CardGroup cg(1);
  cg.run([&](device::Card& card, Communicator&) {
    const std::string error =
        error_of([&] { device::LateReadback<uint32_t, Tag> ring(card, 1, 1); });
    EXPECT_THAT(error, HasSubstr("LateReadback: depth 1, width 1 (a ring of at least 2 slots"));
  });
}

// discard() asks the SlotWait to outlast an abort (retiring does not), oldest slot first, and
// gives up the slot whose wait fails and every later one without waiting for them (each would
// run out the group's timeout again).
TEST(BoundedEventWait, DiscardOutlastsAnAbortAndStopsAtTheFirstFailedWait) {
  GPUBOX_IN_PROCESS_ONLY("deferred streams are the cpu backend's");
  const DeferredStreams defer;
  CardGroup cg(1);
  cg.run([&](device::Card& card, Communicator&) {
    auto value = card.make_buffer<uint32_t>(1);
    device::memset_bytes_async(value.data(), 0, value.bytes(), card.stream());
    struct Call {
      int64_t step;
      device::SlotWaitReason reason;
    };
    std::vector<Call> calls;
    int64_t failing_step = -1;
    device::LateReadback<uint32_t, Tag> ring(
        card, 3, 1, [&](const device::Event& event, const Tag& tag, device::SlotWaitReason reason) {
          calls.push_back({tag.step, reason});
          if (tag.step == failing_step) GPUBOX_FAIL("the test's wait timed out");
          event.synchronize(device::counted_as(reason));
        });
    const auto check = [](const Tag&, const uint32_t*) {};
    int64_t next_step = 0;
    const auto run_steps = [&](int count) {
      for (int i = 0; i < count; ++i) {
        const auto slot = ring.begin(check);
        *slot.tag = Tag{0, next_step++};
        ring.copy_on_card(card.stream(), {{value.data(), 0, sizeof(uint32_t)}});
        ring.commit(card.stream());
      }
    };
    run_steps(4);  // the fourth begin() retires step 0, whose copy is still queued
    ASSERT_EQ(calls.size(), 1u);
    EXPECT_EQ(calls[0].step, 0);
    EXPECT_EQ(calls[0].reason, device::SlotWaitReason::kRingFull);
    calls.clear();
    ring.discard();  // steps 1, 2, 3
    ASSERT_EQ(calls.size(), 3u);
    for (std::size_t i = 0; i < calls.size(); ++i) {
      EXPECT_EQ(calls[i].step, static_cast<int64_t>(i) + 1);
      EXPECT_EQ(calls[i].reason, device::SlotWaitReason::kDiscard);
    }
    calls.clear();
    run_steps(3);  // steps 4, 5, 6 in slots 0, 1, 2
    failing_step = 5;
    ring.discard();
    ASSERT_EQ(calls.size(), 2u);  // step 6 is given up with step 5
    EXPECT_EQ(calls[0].step, 4);
    EXPECT_EQ(calls[1].step, 5);
    EXPECT_EQ(ring.pending(), 0u);
  });
}

}  // namespace
}  // namespace gpubox::comm
