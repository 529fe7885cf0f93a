// device::ComposedStep (heterps/device/composed_step.hpp) and the late readback ring's card-side
// slot counter (late_readback.hpp): a step made of two owners' work (a kernel and a ring of pinned
// slots each, and an all-reduce across 2 cards) captured ONCE and replayed every later step writes
// each step's values into the slot the host hands out for that step (and into that slot's own
// pinned block: LateReadback::copy_to_slot_block), so the host reads every step's values, late,
// exactly as an eager run gives them; each replay is one graph launch and nothing else. An
// abandoned step forgets its deferred slot and the ring starts again at slot 0 on the card too; a
// host wait inside the step is refused naming itself and the graph.
#include <gtest/gtest.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "common/macros.hpp"
#include "heterps/device/composed_step.hpp"
#include "heterps/device/late_readback.hpp"
#include "heterps/device/memory.hpp"
#include "heterps/device/parallel_for.cuh"
#include "heterps/device/step_graph.hpp"
#include "tests/heterps/comm/comm_test_util.hpp"

namespace gpubox::comm {
namespace {

using comm_test::CardGroup;

struct Advance {
  uint64_t* value;
  uint64_t by;
  GPUBOX_HD void operator()(std::size_t) const { *value = *value * 3 + by; }
};

struct Tag {
  int64_t step = -1;
  std::size_t slot = 0;  // the slot's place in the ring (its block's)
};

// One owner of a part of the step: a value on the card advanced each step, and the ring its
// values are read back through (2 words a slot: the value and the all-reduced sum; and the value
// again into the slot's own block).
struct Part {
  Part(device::Card& card, uint64_t by)
      : value(card.make_buffer<uint64_t>(1)),
        sum(card.make_buffer<uint64_t>(1)),
        by(by),
        ring(card, 4, 2) {
    device::memset_bytes_async(value.data(), 0, sizeof(uint64_t), card.stream());
    for (std::size_t i = 0; i < ring.depth(); ++i) {
      blocks.emplace_back(1);
      blocks.back().data()[0] = ~uint64_t{0};
      block_at.push_back(blocks.back().data());
    }
  }
  void check(const Tag& tag, const uint64_t* words) {
    read.push_back({tag.step, words[0], words[1], block_at[tag.slot][0]});
    block_at[tag.slot][0] = ~uint64_t{0};  // a later step's copy must write it again
  }
  // The part's host side every step; its card work only when the open step enqueues.
  void step(device::Card& card, Communicator& comm, int64_t step) {
    const device::Stream& stream = card.stream();
    auto slot = ring.begin([&](const Tag& tag, const uint64_t* words) { check(tag, words); });
    slot.tag->step = step;
    slot.tag->slot = slot.index;
    if (device::ComposedStep::enqueues(stream)) {
      device::parallel_for(stream, 1, Advance{value.data(), by});
      comm.all_reduce_sum(value.data(), sum.data(), 1, stream);
    }
    ring.copy_to_slot_block(stream, block_at.data(), value.data(), 1);
    ring.copy_on_card(stream, {{value.data(), 0, sizeof(uint64_t)},
                               {sum.data(), sizeof(uint64_t), sizeof(uint64_t)}});
    ring.commit(stream);
  }
  void drain() {
    ring.drain([&](const Tag& tag, const uint64_t* words) { check(tag, words); });
  }
  struct Read {
    int64_t step;
    uint64_t value, sum, block;
    bool operator==(const Read& o) const {
      return step == o.step && value == o.value && sum == o.sum && block == o.block;
    }
  };
  device::device_buffer<uint64_t> value, sum;
  uint64_t by;
  device::LateReadback<uint64_t, Tag> ring;
  std::vector<device::pinned_buffer<uint64_t>> blocks;  // one per slot
  std::vector<uint64_t*> block_at;
  std::vector<Read> read;
};

constexpr int64_t kSteps = 11;  // not a multiple of the ring's depth

// Each card: two parts, every step either eagerly or as one composed graph (captured at step 0).
void run_steps(device::Card& card, Communicator& comm, bool composed, Part& a, Part& b,
               std::vector<device::DeviceCounts>* per_step) {
  device::StepGraph graph("test step");
  for (int64_t s = 0; s < kSteps; ++s) {
    const device::DeviceCounts before = card.counts();
    if (composed) {
      device::ComposedStep step(card.stream(), graph,
                                graph.ready() ? device::ComposedStep::Mode::kReplay
                                              : device::ComposedStep::Mode::kCapture);
      a.step(card, comm, s);
      b.step(card, comm, s);
      step.finish();
    } else {
      a.step(card, comm, s);
      b.step(card, comm, s);
    }
    if (per_step != nullptr) per_step->push_back(card.counts() - before);
  }
  a.drain();
  b.drain();
}

TEST(ComposedStep, OneGraphOfTwoOwnersReadsEveryStepsSlotAsTheEagerRun) {
  GPUBOX_REQUIRE_CARDS(2);
  CardGroup g(2);
  std::vector<std::vector<Part::Read>> eager(4), composed(4);
  std::vector<std::vector<device::DeviceCounts>> counts(2);
  g.run([&](device::Card& card, Communicator& comm) {
    const int r = card.local_index();
    Part ea(card, 1 + r), eb(card, 7 + r);
    run_steps(card, comm, /*composed=*/false, ea, eb, nullptr);
    comm.synchronize(card.stream(), "eager run");  // before the next parts' allocations
    Part ca(card, 1 + r), cb(card, 7 + r);
    run_steps(card, comm, /*composed=*/true, ca, cb, &counts[r]);
    eager[2 * r] = ea.read;
    eager[2 * r + 1] = eb.read;
    composed[2 * r] = ca.read;
    composed[2 * r + 1] = cb.read;
  });
  for (std::size_t p = 0; p < eager.size(); ++p) {
    ASSERT_EQ(eager[p].size(), static_cast<std::size_t>(kSteps));
    for (int64_t s = 0; s < kSteps; ++s) EXPECT_EQ(eager[p][s].step, s) << "read in step order";
    EXPECT_TRUE(eager[p] == composed[p]) << "part " << p % 2 << " of card " << p / 2;
    // The values moved every step (a slot read twice, or one never written, would repeat one).
    for (int64_t s = 1; s < kSteps; ++s) EXPECT_NE(composed[p][s].value, composed[p][s - 1].value);
    // Each step's block holds its value: the replayed copy went to the slot's block, not to the
    // one baked in at the capture.
    for (int64_t s = 0; s < kSteps; ++s) EXPECT_EQ(composed[p][s].block, composed[p][s].value);
  }
  for (int r = 0; r < 2; ++r) {
    for (int64_t s = 1; s < kSteps; ++s) {
      const device::DeviceCounts& c = counts[r][s];
      EXPECT_EQ(c.graph_launches, 1u) << "card " << r << " step " << s;
      EXPECT_EQ(c.launches + c.collectives + c.pinned_copies + c.host_syncs + c.allocations, 0u)
          << "card " << r << " step " << s << ": " << device::to_string(c);
    }
    EXPECT_EQ(counts[r][0].graph_captures, 1u);
  }
}

TEST(ComposedStep, AnAbandonedStepForgetsItsSlotsAndTheRingStartsOverOnTheCardToo) {
  GPUBOX_REQUIRE_CARDS(1);
  CardGroup g(1);
  g.run([&](device::Card& card, Communicator& comm) {
    Part a(card, 1), b(card, 2);
    device::StepGraph graph("test step");
    for (int64_t s = 0; s < 3; ++s) {
      device::ComposedStep step(card.stream(), graph,
                                graph.ready() ? device::ComposedStep::Mode::kReplay
                                              : device::ComposedStep::Mode::kCapture);
      a.step(card, comm, s);
      b.step(card, comm, s);
      step.finish();
    }
    // Step 3 fails after a's slot was committed (its event deferred to the step's end).
    EXPECT_THROW(
        {
          device::ComposedStep step(card.stream(), graph, device::ComposedStep::Mode::kReplay);
          a.step(card, comm, 3);
          throw std::runtime_error("a part failed");
        },
        std::runtime_error);
    EXPECT_EQ(a.ring.pending(), 0u) << "the abandoned step's slot (and those before) forgotten";
    EXPECT_FALSE(device::detail::thread_capturing());
    // The ring starts over at slot 0 on the host; the card's counter follows (begin() resets it,
    // outside a capture), so an eager step's values land where the host reads them.
    a.read.clear();
    a.step(card, comm, 4);
    a.drain();
    ASSERT_EQ(a.read.size(), 1u);
    EXPECT_EQ(a.read[0].step, 4);
    const uint64_t value = device::to_host(a.value)[0];
    EXPECT_EQ(a.read[0].value, value);
  });
}

TEST(ComposedStep, AHostWaitInsideTheStepIsRefusedNamingItAndTheGraph) {
  GPUBOX_REQUIRE_CARDS(1);
  CardGroup g(1);
  g.run([&](device::Card& card, Communicator&) {
    device::StepGraph graph("test step");
    try {
      device::ComposedStep step(card.stream(), graph, device::ComposedStep::Mode::kCapture);
      card.stream().synchronize();
      FAIL() << "a host wait inside a captured step was not refused";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("test step"), std::string::npos) << what;
      EXPECT_NE(what.find("synchronize"), std::string::npos) << what;
    }
    EXPECT_FALSE(device::detail::thread_capturing()) << "the abandoned step's capture ended";
    EXPECT_FALSE(graph.ready());
    // And nothing is left open: a new step opens.
    device::ComposedStep again(card.stream(), graph, device::ComposedStep::Mode::kCapture);
    again.finish();
  });
}

}  // namespace
}  // namespace gpubox::comm
