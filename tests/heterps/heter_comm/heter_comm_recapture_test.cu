// When HeterComm's padded steps capture their step graphs again (heter_comm_padded.cu,
// run_graph): a capture bakes in the buffers (the card's memory generation: allocations + frees),
// the pass's padded sizes (reserve_steps' occurrences and pair_block), the pointers a step is
// given (the pull's keys, occurrence count and output; the push's gradients), and the pull graphs
// are kept for the last kPullGraphs (4) sets of pointers, most recently used first. Each of these
// conditions, changed alone, forces exactly one capture of each graph it concerns (the card's
// graph_captures counter, step_graph.hpp), and nothing else does: other batches, other plans and
// pointers already cached replay. The whole script, recaptures and all, pulls and updates the
// same bits as the same steps run eagerly. 1 and 2 simulated cards.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "common/hash.hpp"
#include "heterps/card_table/card_store.hpp"
#include "heterps/comm/communicator.hpp"
#include "heterps/device/card.hpp"
#include "heterps/device/memory.hpp"
#include "heterps/heter_comm/heter_comm.hpp"
#include "table/sparse_row/optimizer.hpp"
#include "tests/heterps/device/test_cards.hpp"

namespace gpubox::heter_comm {
namespace {

using table::AccessorConfig;
using table::RowLayout;

constexpr int kUniverse = 96;
constexpr std::size_t kMostKeys = 64;   // reserve_steps' occurrences (every batch fits)
constexpr std::size_t kFewerKeys = 56;  // a smaller pass: still every batch of the script

AccessorConfig config() {
  AccessorConfig cfg;
  cfg.optimizer.kind = table::SparseOptimizerKind::kAdagrad;
  cfg.mf_dim = 4;
  cfg.optimizer.learning_rate = 0.1f;
  cfg.embedx_threshold = 0.5f;
  cfg.seed = 9;
  return cfg;
}

std::vector<uint64_t> universe() {
  std::vector<uint64_t> keys;
  for (int i = 0; i < kUniverse; ++i) keys.push_back(mix64(777 + i));
  return keys;
}

// What happens before a step, besides its batch.
enum class Before { kNothing, kAllocate, kFree, kFewerKeys, kMostKeys };

// One step of the script: which of the card's buffers it passes (the pointers a graph bakes in),
// what happens before it, and how many captures it must cost each card.
struct Step {
  int keys = 0;   // of 5 key buffers
  int out = 0;    // of 2 output buffers
  int grads = 0;  // of 2 gradient buffers
  int count = 0;  // of 2 occurrence-count words
  Before before = Before::kNothing;
  uint64_t captures = 0;
  const char* why = "";
};

const std::vector<Step>& script() {
  static const std::vector<Step> steps = {
      {0, 0, 0, 0, Before::kNothing, 2, "first step: pull and push captured"},
      {0, 0, 0, 0, Before::kNothing, 0, "another batch, another plan: replayed"},
      {0, 0, 0, 0, Before::kNothing, 0, "and again"},
      {1, 0, 0, 0, Before::kNothing, 1, "new keys pointer: a second pull graph"},
      {0, 0, 0, 0, Before::kNothing, 0, "first keys pointer: still cached"},
      {2, 0, 0, 0, Before::kNothing, 1, "third pull graph"},
      {3, 0, 0, 0, Before::kNothing, 1, "fourth pull graph (the cache is full: 3, 2, 0, 1)"},
      {4, 0, 0, 0, Before::kNothing, 1, "fifth: the least recently used (keys 1) leaves"},
      {0, 0, 0, 0, Before::kNothing, 0, "keys 0: cached (0, 4, 3, 2)"},
      {1, 0, 0, 0, Before::kNothing, 1, "keys 1 was evicted: captured again, keys 2 leaves"},
      {3, 0, 0, 0, Before::kNothing, 0, "keys 3: cached"},
      {2, 0, 0, 0, Before::kNothing, 1, "keys 2 was evicted"},
      {2, 1, 0, 0, Before::kNothing, 1, "new output pointer: the pull only"},
      {2, 1, 0, 1, Before::kNothing, 1, "new occurrence-count pointer: the pull only"},
      {2, 1, 1, 1, Before::kNothing, 1, "new gradients pointer: the push only"},
      {2, 1, 1, 1, Before::kNothing, 0, "same pointers: replayed"},
      {2, 1, 0, 1, Before::kNothing, 1, "one push graph: the old gradients pointer again"},
      {2, 1, 0, 1, Before::kAllocate, 2, "a card allocation: both captured again"},
      {2, 1, 0, 1, Before::kNothing, 0, "replayed"},
      {2, 1, 0, 1, Before::kFree, 2, "a card free: both captured again"},
      {2, 1, 0, 1, Before::kNothing, 0, "replayed"},
      {2, 1, 0, 1, Before::kFewerKeys, 2, "a smaller pass's sizes: both captured again"},
      {2, 1, 0, 1, Before::kNothing, 0, "replayed"},
      {2, 1, 0, 1, Before::kMostKeys, 2, "the larger sizes again: both captured again"},
      {2, 1, 0, 1, Before::kNothing, 0, "replayed"},
  };
  return steps;
}

// batches[step][card] (at most kFewerKeys keys, every one on its owner) and the plans.
struct Data {
  std::vector<std::vector<std::vector<uint64_t>>> keys;
  std::vector<std::vector<uint64_t>> plan;  // [step][src * cards + dst]
  std::size_t pair_block = 0;
};

Data make_data(int cards) {
  const std::vector<uint64_t> all = universe();
  const std::size_t steps = script().size();
  std::mt19937_64 rng(31 + cards);
  Data d;
  d.keys.assign(steps, std::vector<std::vector<uint64_t>>(cards));
  d.plan.assign(steps, std::vector<uint64_t>(static_cast<std::size_t>(cards * cards), 0));
  for (std::size_t s = 0; s < steps; ++s) {
    for (int c = 0; c < cards; ++c) {
      const std::size_t n = 8 + rng() % (kFewerKeys - 7);
      for (std::size_t i = 0; i < n; ++i) d.keys[s][c].push_back(all[rng() % all.size()]);
      const std::set<uint64_t> distinct(d.keys[s][c].begin(), d.keys[s][c].end());
      for (uint64_t k : distinct) ++d.plan[s][c * cards + owner_card(k, cards)];
    }
    for (uint64_t count : d.plan[s]) d.pair_block = std::max<std::size_t>(d.pair_block, count);
  }
  return d;
}

struct RunResult {
  std::vector<std::vector<std::vector<float>>> pulled;  // [step][card]
  std::vector<std::vector<float>> rows;                 // per card: its owned keys' rows
  std::vector<std::vector<uint64_t>> captures;          // [card][step]
};

RunResult run(int cards, bool graphs, const Data& data) {
  const AccessorConfig cfg = config();
  const RowLayout layout = RowLayout::make(cfg.optimizer.kind, cfg.mf_dim);
  HeterCommOptions options;
  options.missing_keys = MissingKeyPolicy::kFail;
  options.step_graphs = graphs;
  device::CardSet set = device::CardSet::from_list(device::testing::card_list(cards));
  auto group = comm::make_group(set, std::chrono::seconds(60));
  const std::vector<Step>& steps = script();
  RunResult out;
  out.pulled.assign(steps.size(), std::vector<std::vector<float>>(cards));
  out.rows.resize(cards);
  out.captures.assign(cards, std::vector<uint64_t>(steps.size(), 0));
  set.run_on_cards(
      [&](device::Card& card) {
        const int c = card.local_index();
        const device::Stream& stream = card.stream();
        card_table::CardSparseStore store(card, cfg);
        HeterComm hc(card, store, group->at(c), options);
        std::vector<uint64_t> mine;
        std::vector<float> rows;
        for (uint64_t k : universe()) {
          if (owner_card(k, cards) != c) continue;
          mine.push_back(k);
          rows.resize(rows.size() + layout.stride());
          table::init_row(rows.data() + rows.size() - layout.stride(), layout, cfg, k, 1);
        }
        auto dk = device::to_device(mine, card.memory(), stream);
        auto dr = device::to_device(rows, card.memory(), stream);
        store.insert_rows(dk.data(), dr.data(), mine.size(), stream);
        StepBounds bounds;
        bounds.occurrences = kMostKeys;
        bounds.unique = kMostKeys;
        bounds.received = kMostKeys * static_cast<std::size_t>(cards);
        bounds.pair_block = data.pair_block;
        hc.reserve_steps(bounds);
        // Every buffer a step may be given, made before the first step (a graph holds their
        // addresses; making one later would itself be a new memory generation).
        std::vector<device::device_buffer<uint64_t>> keys, counts;
        std::vector<device::device_buffer<float>> outs, grads;
        for (int i = 0; i < 5; ++i) keys.push_back(card.make_buffer<uint64_t>(kMostKeys));
        for (int i = 0; i < 2; ++i) {
          counts.push_back(card.make_buffer<uint64_t>(1));
          outs.push_back(card.make_buffer<float>(kMostKeys * hc.pull_dim()));
          grads.push_back(card.make_buffer<float>(kMostKeys * hc.push_dim()));
        }
        std::unique_ptr<device::device_buffer<float>> extra;
        stream.synchronize();
        for (std::size_t s = 0; s < steps.size(); ++s) {
          const Step& step = steps[s];
          const std::vector<uint64_t>& k = data.keys[s][c];
          const uint64_t n = k.size();
          std::vector<float> g(n * hc.push_dim());
          for (std::size_t i = 0; i < g.size(); ++i) {
            g[i] = i % hc.push_dim() == 0 ? 1.0f : 0.01f * static_cast<float>((i + s) % 7) - 0.03f;
          }
          device::copy_async(keys[step.keys].data(), k.data(), n, stream);
          device::copy_async(grads[step.grads].data(), g.data(), g.size(), stream);
          device::copy_async(counts[step.count].data(), &n, 1, stream);
          stream.synchronize();  // before the step: its own allocations would count
          if (step.before == Before::kAllocate) {
            extra = std::make_unique<device::device_buffer<float>>(card.make_buffer<float>(16));
          } else if (step.before == Before::kFree) {
            extra.reset();
          } else if (step.before == Before::kFewerKeys || step.before == Before::kMostKeys) {
            bounds.occurrences = step.before == Before::kFewerKeys ? kFewerKeys : kMostKeys;
            const device::DeviceCounts resized = card.counts();
            hc.reserve_steps(bounds);
            // The sizes alone change: the buffers keep their room (no new memory generation).
            const device::DeviceCounts used = card.counts() - resized;
            EXPECT_EQ(used.allocations + used.frees, 0u) << "step " << s;
          }
          group->at(c).set_step(3, static_cast<int64_t>(s));
          const device::DeviceCounts before = card.counts();
          hc.plan_next_step({data.plan[s].data(), static_cast<std::size_t>(cards)},
                            counts[step.count].data());
          hc.pull(keys[step.keys].data(), n, outs[step.out].data(), stream);
          hc.push_pulled(grads[step.grads].data(), stream);
          out.captures[c][s] = (card.counts() - before).graph_captures;
          out.pulled[s][c] = device::to_host(outs[step.out].data(), n * hc.pull_dim(), stream);
        }
        group->at(c).set_step(-1, -1);
        hc.drain_checks();
        auto rows_out = card.make_buffer<float>(mine.size() * layout.stride());
        store.read_rows(dk.data(), mine.size(), rows_out.data(), stream);
        out.rows[c] = device::to_host(rows_out);
      },
      [&](const std::string& why) { group->abort(why); });
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class Recapture : public ::testing::TestWithParam<int> {};

TEST_P(Recapture, EachConditionCapturesExactlyTheGraphsItConcernsAndNothingElseDoes) {
  const int cards = GetParam();
  GPUBOX_REQUIRE_CARDS(cards);
  const Data data = make_data(cards);
  const RunResult graphs = run(cards, /*graphs=*/true, data);
  const RunResult eager = run(cards, /*graphs=*/false, data);
  const std::vector<Step>& steps = script();
  for (int c = 0; c < cards; ++c) {
    for (std::size_t s = 0; s < steps.size(); ++s) {
      EXPECT_EQ(graphs.captures[c][s], steps[s].captures)
          << "card " << c << ", step " << s << ": " << steps[s].why;
      EXPECT_EQ(eager.captures[c][s], 0u) << "card " << c << ", step " << s << " (eager)";
      EXPECT_TRUE(same_bits(graphs.pulled[s][c], eager.pulled[s][c]))
          << "card " << c << ", step " << s << "'s pull: " << steps[s].why;
    }
    EXPECT_TRUE(same_bits(graphs.rows[c], eager.rows[c])) << "card " << c << "'s rows";
  }
}

INSTANTIATE_TEST_SUITE_P(Cards, Recapture, ::testing::Values(1, 2),
                         [](const auto& info) { return std::to_string(info.param) + "cards"; });

}  // namespace
}  // namespace gpubox::heter_comm
