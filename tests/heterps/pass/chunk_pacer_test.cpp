// ChunkPacer and ChunkChain (heterps/pass/chunk_pacer.hpp), the sizes and the chain of the next
// pass's chunks between steps: against hand-computed sizes and a simulated card that lags the
// host. Host code alone; part of the pass_manager_test binary.
#include "heterps/pass/chunk_pacer.hpp"

#include <gtest/gtest.h>

#include <cstddef>
#include <optional>
#include <utility>
#include <vector>

namespace gpubox::pass {
namespace {

// ChunkPacer against hand-computed sizes: unpaced, every chunk is the largest; paced, it starts
// at kStartKeys, aims at step_fraction of the step at the measured rate, at most doubles or
// halves a chunk at a time, stays within [kMinKeys, max], and ignores measures that are not
// positive.
TEST(ChunkPacer, AimsAtAFractionOfTheStepWithinItsBounds) {
  const ChunkPacer unpaced(100000, 0);
  EXPECT_FALSE(unpaced.paced());
  EXPECT_EQ(unpaced.keys(), 100000u);
  ChunkPacer same = unpaced;
  same.observe(100000, 1.0, 0.001);
  EXPECT_EQ(same.keys(), 100000u);

  ChunkPacer pacer(100000, 0.25);
  EXPECT_EQ(pacer.keys(), ChunkPacer::kStartKeys);
  // 4096 keys took as long as the step (1 ms): 1024 keys would take a quarter; halved first.
  pacer.observe(4096, 1e-3, 1e-3);
  EXPECT_EQ(pacer.keys(), 2048u);
  pacer.observe(2048, 0.5e-3, 1e-3);  // the same rate
  EXPECT_EQ(pacer.keys(), 1024u);
  pacer.observe(1024, 0.25e-3, 1e-3);  // on target: stays
  EXPECT_EQ(pacer.keys(), 1024u);
  // 16x faster than that: 16384 wanted, doubled at most.
  pacer.observe(1024, 0.25e-3 / 16, 1e-3);
  EXPECT_EQ(pacer.keys(), 2048u);
  pacer.observe(2048, 0, 1e-3);  // no measure
  pacer.observe(2048, 1e-3, -1);
  EXPECT_EQ(pacer.keys(), 2048u);
  for (int i = 0; i < 20; ++i) pacer.observe(pacer.keys(), 1.0, 1e-3);  // very slow
  EXPECT_EQ(pacer.keys(), ChunkPacer::kMinKeys);
  for (int i = 0; i < 20; ++i) pacer.observe(pacer.keys(), 1e-9, 1e-3);  // very fast
  EXPECT_EQ(pacer.keys(), 100000u);
  // A largest size under the start and the floor.
  EXPECT_EQ(ChunkPacer(100, 0.25).keys(), 100u);
  ChunkPacer small(100, 0.25);
  small.observe(100, 1.0, 1e-3);
  EXPECT_EQ(small.keys(), 100u);
}

// ChunkChain against a simulated card whose stream runs `lag` polls behind the host: each poll
// the host enqueues one step (step_seconds of card time) and, when the chain lets it, a chunk
// (seconds_per_key a key) after it; a chunk's end has passed `lag` polls after it started. The
// card's clock gives every begin and end event its time, kept by event index as NextPassWork
// keeps its events, so the chain's own bookkeeping (which event ended the chunk before) is what
// the measures rest on.
struct SimulatedChain {
  SimulatedChain(std::size_t chain_depth, int card_lag) : depth(chain_depth), lag(card_lag) {}
  std::size_t depth;
  int lag;
  double step_seconds = 1e-3;
  double seconds_per_key = 1e-7;
  std::size_t started = 0;  // chunks
  std::vector<std::size_t> sizes;

  ChunkChain run(ChunkPacer pacer, int polls) {
    ChunkChain chain(pacer, depth);
    std::vector<double> begins(chain.depth() + 1, -1), ends(chain.depth() + 1, -1);
    std::vector<int> started_at(chain.depth() + 1, 0);
    double clock = 0;
    for (int p = 0; p < polls; ++p) {
      clock += step_seconds;  // the step before this poll
      chain.poll();
      while (chain.in_flight() > 0 && started_at[chain.oldest().event] + lag <= p) {
        const ChunkChain::Chunk& oldest = chain.oldest();
        std::optional<ChunkChain::Times> times;
        if (oldest.steps_before > 0) {
          times = ChunkChain::Times{ends[oldest.event] - begins[oldest.event],
                                    begins[oldest.event] - ends[chain.previous_event(oldest)]};
        }
        chain.retire(times);
      }
      if (const auto chunk = chain.start(1u << 30)) {
        begins[chunk->event] = clock;
        clock += static_cast<double>(chunk->keys) * seconds_per_key;
        ends[chunk->event] = clock;
        started_at[chunk->event] = p;
        ++started;
        sizes.push_back(chunk->keys);
      }
    }
    return chain;
  }
};

// Issue 31, item 4 (review): with one chunk in flight and a host running steps ahead of the
// card, the next pass's look-ups advanced once every `lag` steps. The chain keeps kDepth in
// flight: a chunk starts at every step for a lag up to kDepth; one in flight (what it replaced)
// starts one every `lag` polls.
TEST(ChunkChain, StartsAChunkEveryStepWhileTheCardLags) {
  for (int lag = 1; lag <= static_cast<int>(ChunkChain::kDepth); ++lag) {
    SimulatedChain chain{ChunkChain::kDepth, lag};
    chain.run(ChunkPacer(1000, 0), 100);
    EXPECT_EQ(chain.started, 100u) << "lag " << lag;
  }
  SimulatedChain one{1, 5};
  one.run(ChunkPacer(1000, 0), 100);
  EXPECT_EQ(one.started, 20u);
  SimulatedChain behind{ChunkChain::kDepth, 2 * static_cast<int>(ChunkChain::kDepth)};
  behind.run(ChunkPacer(1000, 0), 100);  // further behind than the chain is deep: no deadlock
  EXPECT_EQ(behind.started, 50u);
}

// The pacer's measures come from the chain's event times: at 0.1 us a key and a 1 ms step, a
// quarter of the step is 2500 keys. The chain reaches it from kStartKeys (halved at most once a
// chunk) whatever the lag, including when polls find the chain full and start nothing (the gap
// before the next chunk then spans several steps and is shared among them; before, such an idle
// poll restarted the measures and a lagging card was never paced).
TEST(ChunkChain, PacesFromTheGapsBetweenChunksAcrossIdlePolls) {
  for (const auto& [depth, lag] : std::vector<std::pair<std::size_t, int>>{
           {1, 1}, {1, 4}, {2, 5}, {ChunkChain::kDepth, 3}, {ChunkChain::kDepth, 9}}) {
    SimulatedChain sim{depth, lag};
    const ChunkChain chain = sim.run(ChunkPacer(100000, 0.25), 60);
    EXPECT_EQ(chain.pacer().keys(), 2500u) << "depth " << depth << ", lag " << lag;
    ASSERT_FALSE(sim.sizes.empty());
    EXPECT_EQ(sim.sizes.front(), ChunkPacer::kStartKeys);
    EXPECT_EQ(sim.sizes.back(), 2500u) << "depth " << depth << ", lag " << lag;
  }
  // The first chunk has no step measured before it: one chunk alone does not move the pacer.
  SimulatedChain first{ChunkChain::kDepth, 1};
  EXPECT_EQ(first.run(ChunkPacer(100000, 0.25), 2).pacer().keys(), ChunkPacer::kStartKeys);
  EXPECT_EQ(first.started, 2u);
}

// A chunk that found no work (a mark window without this card's keys, nothing left to erase or
// insert) takes ~0 s of card time: measured as a chunk of the pacer's size, it would double the
// next chunk (review of h68). Its size set to 0 measures nothing; one that did part of its size
// is measured at what it did.
TEST(ChunkChain, AChunkThatDidNoWorkMeasuresNothing) {
  const auto run = [](std::size_t second_keys) {
    ChunkChain chain(ChunkPacer(100000, 0.25), 2);
    chain.start(1u << 30);  // the first: nothing before it to measure against
    chain.retire(std::nullopt);
    chain.poll();
    chain.start(1u << 30);
    chain.set_newest_keys(second_keys);
    chain.retire(ChunkChain::Times{1e-9, 1e-3});  // ~0 s of card work after a 1 ms step
    return chain.pacer().keys();
  };
  EXPECT_EQ(run(0), ChunkPacer::kStartKeys);
  EXPECT_EQ(run(ChunkPacer::kStartKeys), 2 * ChunkPacer::kStartKeys);
}

}  // namespace
}  // namespace gpubox::pass
