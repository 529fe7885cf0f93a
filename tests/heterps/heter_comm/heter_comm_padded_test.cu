// HeterComm's planned steps at the pass's fixed sizes (StepBounds::pair_block with the step's
// occurrence count on the card: heter_comm_padded.cu), sharded (gpubox mode) and replicated
// (Collective mode: every card holds every row), on 1, 2 and 4 simulated cards, on skewed keys (a
// few hot keys, many cold ones) with a batch size that varies step to step:
//   - their pull records and the final rows are bit-identical to unpadded planned steps' (the
//     oracle: the same sums in the same order), as step graphs and eagerly;
//   - as step graphs, a steady step is 2 graph launches and the check's copy into its ring slot
//     (one kernel; inside a caller's composed step it joins the caller's graph): no other launch,
//     no collective or host wait outside them, no allocation (eagerly: 3 collectives sharded, 2
//     replicated) (the
//     cpu backend's capture mode refuses a host wait, an allocation, a pageable copy or a Thrust
//     call: a capture that succeeded proves the step capturable);
//   - a plan that does not describe a batch still fails late, naming the step.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "common/error.hpp"
#include "common/hash.hpp"
#include "heterps/card_table/card_store.cuh"
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

constexpr int kSteps = 9;
constexpr int kUniverse = 600;

AccessorConfig config() {
  AccessorConfig cfg;
  cfg.optimizer.kind = table::SparseOptimizerKind::kAdagrad;
  cfg.mf_dim = 8;
  cfg.optimizer.learning_rate = 0.1f;
  cfg.optimizer.mf_learning_rate = 0.08f;
  cfg.embedx_threshold = 1.5f;  // embedx appears mid-run for the hot keys
  cfg.seed = 5;
  return cfg;
}

std::vector<uint64_t> universe() {
  std::vector<uint64_t> keys;
  for (int i = 0; i < kUniverse; ++i) keys.push_back(mix64(1234 + i));
  keys[1] = 0;  // a key of value 0: a padded slot's key must never be taken for it
  return keys;
}

// batches[step][card]: skewed keys (rank ~ u^3), a size that varies per step and card.
struct Data {
  std::vector<std::vector<std::vector<uint64_t>>> keys;
  std::vector<std::vector<std::vector<float>>> grads;
  // Sharded: [step][src * cards + dst], the distinct keys src sends owner dst; replicated:
  // [step][src], src's distinct keys (which every card receives).
  std::vector<std::vector<uint64_t>> plan;
  StepBounds bounds;  // the pass's maxima over every card (enough)
};

Data make_data(int cards, int push_dim, Placement placement) {
  const bool replicated = placement == Placement::kReplicated;
  const int row = replicated ? 1 : cards;
  const std::vector<uint64_t> all = universe();
  std::mt19937_64 rng(77 + cards);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  Data d;
  d.keys.assign(kSteps, std::vector<std::vector<uint64_t>>(cards));
  d.grads.assign(kSteps, std::vector<std::vector<float>>(cards));
  d.plan.assign(kSteps, std::vector<uint64_t>(static_cast<std::size_t>(cards * row), 0));
  for (int s = 0; s < kSteps; ++s) {
    for (int c = 0; c < cards; ++c) {
      const std::size_t n = (s == 4 && c == 0) ? 0 : 20 + rng() % 260;  // one empty batch
      for (std::size_t i = 0; i < n; ++i) {
        const double u = unit(rng);
        d.keys[s][c].push_back(all[static_cast<std::size_t>(u * u * u * kUniverse) % kUniverse]);
        for (int f = 0; f < push_dim; ++f) {
          d.grads[s][c].push_back(f == 0 ? 1.0f : static_cast<float>(unit(rng) - 0.4));
        }
      }
      const std::set<uint64_t> distinct(d.keys[s][c].begin(), d.keys[s][c].end());
      for (uint64_t k : distinct) ++d.plan[s][c * row + (replicated ? 0 : owner_card(k, cards))];
      d.bounds.occurrences = std::max(d.bounds.occurrences, n);
      d.bounds.unique = std::max(d.bounds.unique, distinct.size());
      d.bounds.block = std::max(d.bounds.block, distinct.size());
    }
    if (replicated) {  // every card receives every card's distinct keys
      std::size_t received = 0;
      for (int c = 0; c < cards; ++c) received += d.plan[s][c];
      d.bounds.received = std::max(d.bounds.received, received);
      d.bounds.pair_block = d.bounds.block;
      continue;
    }
    for (int o = 0; o < cards; ++o) {
      std::size_t received = 0;
      for (int c = 0; c < cards; ++c) {
        received += d.plan[s][c * cards + o];
        d.bounds.pair_block = std::max<std::size_t>(d.bounds.pair_block, d.plan[s][c * cards + o]);
      }
      d.bounds.received = std::max(d.bounds.received, received);
    }
  }
  return d;
}

// How a run plans its steps.
enum class Mode { kUnpadded, kPaddedEager, kPaddedGraphs };
// What a step does: pull and push_pulled (training), pull alone (an evaluation before pull_only),
// pull_only (an evaluation).
enum class Use { kTrain, kPullNoPush, kPullOnly };

struct RunResult {
  std::vector<std::vector<std::vector<float>>> pulled;  // [step][card]
  std::vector<std::vector<float>> rows;                 // per card: its keys' rows (owned, or all)
  std::vector<device::DeviceCounts> last_step;          // per card: the last step's counts
  // Per card: HeterComm::memory() after reserve_steps, and the card memory's bytes in use and
  // high-water mark (the device layer's counters) before reserve_steps, after it (and the
  // steps' own buffers), and after the steps.
  std::vector<HeterCommMemory> memory;
  std::vector<std::size_t> in_use_before, in_use_reserved, in_use_after;
  std::vector<std::size_t> peak_reserved, peak_after;
  std::vector<std::string> push_refused;  // Use::kPullOnly: push_pulled's error after the steps
};

// `wrong_plan` replaces step `wrong_step`'s plan; `absent` (when not 0) is never placed on its
// owner.
RunResult run(int cards, Placement placement, Mode mode, const Data& data,
              const std::vector<uint64_t>* wrong_plan = nullptr, int wrong_step = -1,
              uint64_t absent = 0, Use use = Use::kTrain) {
  const bool replicated = placement == Placement::kReplicated;
  const AccessorConfig cfg = config();
  const RowLayout layout = RowLayout::make(cfg.optimizer.kind, cfg.mf_dim);
  HeterCommOptions options;
  options.missing_keys = MissingKeyPolicy::kFail;
  options.step_graphs = mode == Mode::kPaddedGraphs;
  options.placement = placement;
  std::string list;
  for (int c = 0; c < cards; ++c) list += (c ? "," : "") + std::to_string(c);
  device::CardSet set = device::CardSet::from_list(list);
  auto group = comm::make_group(set, std::chrono::seconds(60));
  std::vector<std::unique_ptr<card_table::CardSparseStore>> stores(cards);
  std::vector<std::unique_ptr<HeterComm>> comms(cards);
  RunResult out;
  out.pulled.assign(kSteps, std::vector<std::vector<float>>(cards));
  out.rows.resize(cards);
  out.last_step.resize(cards);
  out.memory.resize(cards);
  out.push_refused.resize(cards);
  for (auto* v : {&out.in_use_before, &out.in_use_reserved, &out.in_use_after, &out.peak_reserved,
                  &out.peak_after}) {
    v->resize(cards);
  }
  const std::vector<uint64_t> all = universe();
  set.run_on_cards(
      [&](device::Card& card) {
        const int c = card.local_index();
        const device::Stream& stream = card.stream();
        stores[c] = std::make_unique<card_table::CardSparseStore>(card, cfg);
        comms[c] = std::make_unique<HeterComm>(card, *stores[c], group->at(c), options);
        std::vector<uint64_t> mine;
        std::vector<float> rows;
        for (uint64_t k : all) {
          if ((!replicated && owner_card(k, cards) != c) || (absent != 0 && k == absent)) continue;
          mine.push_back(k);
          rows.resize(rows.size() + layout.stride());
          table::init_row(rows.data() + rows.size() - layout.stride(), layout, cfg, k, 1);
        }
        auto dk = device::to_device(mine, card.memory(), stream);
        auto dr = device::to_device(rows, card.memory(), stream);
        stores[c]->insert_rows(dk.data(), dr.data(), mine.size(), stream);
        HeterComm& hc = *comms[c];
        StepBounds bounds = data.bounds;
        if (mode == Mode::kUnpadded) bounds.pair_block = 0;
        stream.synchronize();
        out.in_use_before[c] = card.memory().bytes_in_use();
        hc.reserve_steps(bounds);
        out.memory[c] = hc.memory();
        // The step's buffers, sized once (a graph's capture holds their addresses).
        const std::size_t most = data.bounds.occurrences;
        auto keys = card.make_buffer<uint64_t>(std::max<std::size_t>(most, 1));
        auto grads = card.make_buffer<float>(std::max<std::size_t>(most, 1) * hc.push_dim());
        auto pulled = card.make_buffer<float>(std::max<std::size_t>(most, 1) * hc.pull_dim());
        auto n_on_card = card.make_buffer<uint64_t>(1);
        stream.synchronize();
        out.in_use_reserved[c] = card.memory().bytes_in_use();
        out.peak_reserved[c] = card.memory().peak_bytes();
        const std::size_t row = replicated ? 1 : static_cast<std::size_t>(cards);
        for (int s = 0; s < kSteps; ++s) {
          const std::vector<uint64_t>& k = data.keys[s][c];
          const uint64_t n = k.size();
          if (n > 0) {
            device::copy_async(keys.data(), k.data(), k.size(), stream);
            device::copy_async(grads.data(), data.grads[s][c].data(), data.grads[s][c].size(),
                               stream);
          }
          device::copy_async(n_on_card.data(), &n, 1, stream);
          group->at(c).set_step(2, s);
          const device::DeviceCounts before = card.counts();
          const uint64_t* plan = s == wrong_step ? wrong_plan->data() : data.plan[s].data();
          hc.plan_next_step({plan, row}, mode == Mode::kUnpadded ? nullptr : n_on_card.data());
          if (use == Use::kPullOnly) {
            hc.pull_only(keys.data(), n, pulled.data(), stream);
          } else {
            hc.pull(keys.data(), n, pulled.data(), stream);
          }
          if (use == Use::kTrain) hc.push_pulled(grads.data(), stream);
          out.last_step[c] = card.counts() - before;
          out.pulled[s][c] = device::to_host(pulled.data(), n * hc.pull_dim(), stream);
        }
        group->at(c).set_step(-1, -1);
        hc.drain_checks();
        if (use == Use::kPullOnly) {
          try {  // refused before any collective: no peer waits for it
            hc.push_pulled(grads.data(), stream);
          } catch (const Error& e) {
            out.push_refused[c] = e.what();
          }
        }
        stream.synchronize();
        out.in_use_after[c] = card.memory().bytes_in_use();
        out.peak_after[c] = card.memory().peak_bytes();
        auto rows_out = card.make_buffer<float>(mine.size() * layout.stride());
        stores[c]->read_rows(dk.data(), mine.size(), rows_out.data(), stream);
        out.rows[c] = device::to_host(rows_out);
        comms[c].reset();
        stores[c].reset();
      },
      [&](const std::string& why) { group->abort(why); });
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class PaddedSteps : public ::testing::TestWithParam<std::tuple<int, Placement>> {
 protected:
  int cards() const { return std::get<0>(GetParam()); }
  Placement placement() const { return std::get<1>(GetParam()); }
  bool replicated() const { return placement() == Placement::kReplicated; }
  Data data() const {
    const RowLayout layout = RowLayout::make(config().optimizer.kind, config().mf_dim);
    return make_data(cards(), layout.push_dim(), placement());
  }
};

TEST_P(PaddedSteps, EqualUnpaddedStepsBitForBitAsGraphsAndEagerly) {
  const int cards = this->cards();
  GPUBOX_REQUIRE_CARDS(cards);
  const Data data = this->data();
  const RunResult want = run(cards, placement(), Mode::kUnpadded, data);
  for (const Mode mode : {Mode::kPaddedEager, Mode::kPaddedGraphs}) {
    SCOPED_TRACE(mode == Mode::kPaddedGraphs ? "step graphs" : "eagerly");
    const RunResult got = run(cards, placement(), mode, data);
    for (int s = 0; s < kSteps; ++s) {
      for (int c = 0; c < cards; ++c) {
        EXPECT_TRUE(same_bits(got.pulled[s][c], want.pulled[s][c]))
            << "step " << s << " card " << c;
      }
    }
    for (int c = 0; c < cards; ++c) {
      EXPECT_TRUE(same_bits(got.rows[c], want.rows[c])) << "card " << c << "'s rows";
      // Replicated: every replica is the same table (and it changed: the steps updated it).
      if (replicated()) {
        EXPECT_TRUE(same_bits(got.rows[c], got.rows[0])) << "card " << c;
      }
    }
  }
}

TEST_P(PaddedSteps, AsStepGraphsAStepIsTwoGraphLaunchesAndNothingElse) {
  const int cards = this->cards();
  GPUBOX_REQUIRE_CARDS(cards);
  const Data data = this->data();
  const RunResult graphs = run(cards, placement(), Mode::kPaddedGraphs, data);
  const RunResult eager = run(cards, placement(), Mode::kPaddedEager, data);
  for (int c = 0; c < cards; ++c) {
    const device::DeviceCounts& g = graphs.last_step[c];
    const device::DeviceCounts& e = eager.last_step[c];
    EXPECT_EQ(g.graph_launches, 2u) << "card " << c;  // "sparse pull", "sparse push"
    EXPECT_EQ(g.launches, 1u) << "card " << c;        // the check into its ring slot
    EXPECT_EQ(g.collectives, 0u) << "card " << c;
    EXPECT_EQ(g.card_copies, 0u) << "card " << c;
    EXPECT_EQ(g.host_syncs, 0u) << "card " << c;
    EXPECT_EQ(g.allocations, 0u) << "card " << c;
    EXPECT_EQ(g.pinned_copies, 0u) << "card " << c;  // the check: a kernel writes its slot
    // The same work, eagerly: every node a launch, a card copy or a collective. Sharded: keys
    // out, records back, push records out (3); replicated: keys and push records all-gathered,
    // the pull records read from the card's own replica (2).
    EXPECT_EQ(e.graph_launches, 0u) << "card " << c;
    EXPECT_EQ(e.collectives, replicated() ? 2u : 3u) << "card " << c;
    EXPECT_EQ(e.host_syncs, 0u) << "card " << c;
    EXPECT_EQ(g.graph_nodes + g.launches, e.launches + e.collectives + e.card_copies)
        << "card " << c;
  }
}

TEST_P(PaddedSteps, AWrongPlanStillFailsLateNamingTheStep) {
  const int cards = this->cards();
  GPUBOX_REQUIRE_CARDS(cards);
  const Data data = this->data();
  // Step 3's plan says card 0 sends one key fewer to the last card (1 card: to itself;
  // replicated: to every card) than its batch has: its late check finds its row unlike the plan.
  std::vector<uint64_t> wrong = data.plan[3];
  const std::size_t entry = replicated() ? 0 : static_cast<std::size_t>(cards - 1);
  ASSERT_GT(wrong[entry], 0u);
  --wrong[entry];
  std::string message;
  try {
    run(cards, placement(), Mode::kPaddedGraphs, data, &wrong, 3);
  } catch (const Error& e) {
    message = e.what();
  }
  ASSERT_FALSE(message.empty()) << "a wrong plan went unnoticed";
  EXPECT_NE(message.find("pass 2, step 3: "), std::string::npos) << message;
  EXPECT_NE(message.find("plan does not describe"), std::string::npos) << message;
}

TEST_P(PaddedSteps, AMissingKeyFailsLateNamingItsOwnerAndStep) {
  const int cards = this->cards();
  GPUBOX_REQUIRE_CARDS(cards);
  const Data data = this->data();
  const uint64_t absent = universe()[0];  // the hottest key: in the first step's batches
  std::string message;
  try {
    run(cards, placement(), Mode::kPaddedGraphs, data, nullptr, -1, absent);
  } catch (const Error& e) {
    message = e.what();
  }
  ASSERT_FALSE(message.empty()) << "the missing key went unnoticed";
  // Replicated: every replica misses it (any card may be the first to fail).
  const std::string where = replicated() ? " is missing on the replica of card "
                                         : " is missing on its owner card " +
                                               std::to_string(owner_card(absent, cards)) +
                                               " (requested by card ";
  EXPECT_NE(message.find("pass 2, step 0: HeterComm pull: key " + std::to_string(absent) + where),
            std::string::npos)
      << message;
}

// HeterComm::pull_only (an evaluation's step): the records of pull, bit for bit (the unpadded
// pull's, and the padded pull's that evaluations ran before it), in one "sparse lookup" graph of
// fewer nodes than the pull's (no owner merge plan) and, replicated, without any collective; the
// rows stay as they were; push_pulled after it is refused.
TEST_P(PaddedSteps, APullOnlyLooksUpTheSameRecordsWithLessWork) {
  const int cards = this->cards();
  GPUBOX_REQUIRE_CARDS(cards);
  const Data data = this->data();
  const RunResult want =
      run(cards, placement(), Mode::kUnpadded, data, nullptr, -1, 0, Use::kPullNoPush);
  const RunResult pulls =
      run(cards, placement(), Mode::kPaddedGraphs, data, nullptr, -1, 0, Use::kPullNoPush);
  const RunResult eager =
      run(cards, placement(), Mode::kPaddedEager, data, nullptr, -1, 0, Use::kPullOnly);
  for (const Mode mode : {Mode::kUnpadded, Mode::kPaddedEager, Mode::kPaddedGraphs}) {
    SCOPED_TRACE(mode == Mode::kUnpadded      ? "unpadded"
                 : mode == Mode::kPaddedEager ? "eagerly"
                                              : "graphs");
    const RunResult got = mode == Mode::kPaddedEager
                              ? eager
                              : run(cards, placement(), mode, data, nullptr, -1, 0, Use::kPullOnly);
    for (int s = 0; s < kSteps; ++s) {
      for (int c = 0; c < cards; ++c) {
        EXPECT_TRUE(same_bits(got.pulled[s][c], want.pulled[s][c]))
            << "step " << s << " card " << c;
        EXPECT_TRUE(same_bits(got.pulled[s][c], pulls.pulled[s][c]))
            << "step " << s << " card " << c;
      }
    }
    for (int c = 0; c < cards; ++c) {
      EXPECT_TRUE(same_bits(got.rows[c], want.rows[c])) << "card " << c << "'s rows";
      EXPECT_NE(got.push_refused[c].find("or a pull_only, which planned no push"),
                std::string::npos)
          << "card " << c << ": " << got.push_refused[c];
      if (mode != Mode::kPaddedGraphs) continue;
      const device::DeviceCounts& g = got.last_step[c];
      const device::DeviceCounts& e = eager.last_step[c];
      const device::DeviceCounts& p = pulls.last_step[c];
      EXPECT_EQ(g.graph_launches, 1u) << "card " << c;  // "sparse lookup"
      // Outside its graph: the check into the pinned slot the card's counter picks, one kernel
      // (LateReadback::copy_on_card; inside a composed step it joins the step's graph).
      EXPECT_EQ(g.launches, 1u) << "card " << c;
      EXPECT_EQ(g.collectives + g.card_copies + g.host_syncs + g.allocations, 0u) << "card " << c;
      EXPECT_EQ(g.pinned_copies, 0u) << "card " << c;
      // Eagerly: the keys out and the records back (sharded), nothing (replicated); every node
      // a launch or a collective. The pull's graph also plans the owner merge (4 nodes; on 1
      // card 3) and, replicated, all-gathers the keys.
      EXPECT_EQ(e.collectives, replicated() ? 0u : 2u) << "card " << c;
      EXPECT_EQ(g.graph_nodes + 1, e.launches + e.collectives + e.card_copies) << "card " << c;
      EXPECT_EQ(g.graph_nodes + (cards == 1 ? 3u : 4u) + (replicated() ? 1u : 0u), p.graph_nodes)
          << "card " << c;
    }
  }
}

// A key missing in a pull_only step fails late as a pull's does, naming its step, the card that
// holds no row for it and the card whose batch asked for it (replicated: the card itself, whose
// own block is all it looks up). The key: one that only the last card's batches hold.
TEST_P(PaddedSteps, AKeyMissingInAPullOnlyFailsLateNamingTheRequestingCard) {
  const int cards = this->cards();
  GPUBOX_REQUIRE_CARDS(cards);
  const Data data = this->data();
  const int last = cards - 1;
  uint64_t absent = 0;
  int first_step = -1;
  for (uint64_t key : universe()) {
    if (key == 0) continue;
    int in_last = -1;
    bool elsewhere = false;
    for (int s = 0; s < kSteps; ++s) {
      for (int c = 0; c < cards; ++c) {
        const auto& batch = data.keys[s][c];
        if (std::find(batch.begin(), batch.end(), key) == batch.end()) continue;
        if (c != last) elsewhere = true;
        if (c == last && in_last < 0) in_last = s;
      }
    }
    if (in_last >= 0 && !elsewhere) {
      absent = key;
      first_step = in_last;
      break;
    }
  }
  ASSERT_NE(absent, 0u) << "no key only the last card's batches hold";
  std::string message;
  try {
    run(cards, placement(), Mode::kPaddedGraphs, data, nullptr, -1, absent, Use::kPullOnly);
  } catch (const Error& e) {
    message = e.what();
  }
  const std::string holder =
      replicated() ? " is missing on the replica of card " + std::to_string(last)
                   : " is missing on its owner card " + std::to_string(owner_card(absent, cards));
  EXPECT_NE(message.find("pass 2, step " + std::to_string(first_step) + ": HeterComm pull: key " +
                         std::to_string(absent) + holder + " (requested by card " +
                         std::to_string(last) + ";"),
            std::string::npos)
      << message;
}

// The padded steps' buffers in bytes (the formula reserve_padded sizes by): `block` keys per pair
// of cards, `slots` = cards * block received, the batch's `occurrences` positions. Sharded: keys
// to every owner, the pull records of every slot back, the push records by slot (and one discard
// row per unique index). Replicated: one key block to every card, the pull records of its own
// block only, its one push block out and every card's in.
std::size_t padded_bytes(int cards, Placement placement, const StepBounds& bounds,
                         std::size_t pull_dim, std::size_t push_dim, bool before_issue_31 = false) {
  const bool replicated = placement == Placement::kReplicated;
  const std::size_t c = static_cast<std::size_t>(cards);
  const std::size_t block = bounds.pair_block;
  const std::size_t slots = c * block;
  const std::size_t occurrences = bounds.occurrences;
  const std::size_t widest = std::max(pull_dim, push_dim);
  std::size_t recv_records =
      replicated ? std::max(block * pull_dim, slots * push_dim) : slots * widest;
  std::size_t send_records = replicated
                                 ? (block + occurrences) * push_dim
                                 : std::max(slots * pull_dim, (slots + occurrences) * push_dim);
  if (before_issue_31) {  // both placements sized as the sharded one's widest
    recv_records = slots * widest;
    send_records = (slots + occurrences) * widest;
  }
  const std::size_t keys = ((replicated ? 1 : c) + c) * (block + 1) + slots;
  return keys * sizeof(uint64_t) + 2 * slots * sizeof(card_table::row_index_t) +
         (recv_records + send_records + slots * push_dim) * sizeof(float) +
         occurrences * sizeof(uint32_t);
}

// Collective mode reserves what its padded steps use and nothing else (issue 31): the padded
// blocks sized by placement, none of the unpadded steps' buffers (replicated, those scale with
// every card's distinct keys: cards * block keys and push records, and the received keys' records,
// rows and merge), and the steps raise no high-water mark of the card's memory.
TEST_P(PaddedSteps, APaddedPassReservesOnlyItsBlocksSizedByPlacement) {
  const int cards = this->cards();
  GPUBOX_REQUIRE_CARDS(cards);
  const Data data = this->data();
  const RowLayout layout = RowLayout::make(config().optimizer.kind, config().mf_dim);
  const auto pull_dim = static_cast<std::size_t>(layout.pull_dim());
  const auto push_dim = static_cast<std::size_t>(layout.push_dim());
  const RunResult padded = run(cards, placement(), Mode::kPaddedGraphs, data);
  const RunResult unpadded = run(cards, placement(), Mode::kUnpadded, data);
  const std::size_t want = padded_bytes(cards, placement(), data.bounds, pull_dim, push_dim);
  const std::size_t was = padded_bytes(cards, placement(), data.bounds, pull_dim, push_dim, true);
  for (int c = 0; c < cards; ++c) {
    SCOPED_TRACE("card " + std::to_string(c));
    EXPECT_EQ(padded.memory[c].padded, want);
    EXPECT_EQ(padded.memory[c].unpadded, 0u);  // was reserved besides, as the unpadded run does
    EXPECT_GT(unpadded.memory[c].unpadded, 0u);
    EXPECT_EQ(unpadded.memory[c].padded, 0u);
    // The card memory reserve_steps took (the device layer's counter) holds the blocks, besides
    // what both kinds of step share (the local dedup, the owner merge, the reducer, the scratch
    // arena, the steps' own buffers here).
    EXPECT_GE(padded.in_use_reserved[c] - padded.in_use_before[c], want);
    // No step grew anything, nor raised the card's high-water mark.
    EXPECT_EQ(padded.in_use_after[c], padded.in_use_reserved[c]);
    EXPECT_EQ(padded.peak_after[c], padded.peak_reserved[c]);
  }
  if (replicated() && cards > 1) {
    EXPECT_LT(want, was);  // the records' buffers: (block + occurrences) * push_dim, not slots
  }
  std::printf(
      "[ memory   ] %d cards %s: padded blocks %zu bytes (sized as before: %zu), unpadded "
      "buffers not reserved: %zu bytes\n",
      cards, replicated() ? "replicated" : "sharded", want, was, unpadded.memory[0].unpadded);
}

// A padded pass sizes only its blocks: a planned step that does not give its occurrence count on
// the card would run unpadded in buffers nobody sized (growing them while the previous step's
// collectives may run), so it is refused; with padded steps off the same plan is taken.
TEST(PlannedCountsWidth, APaddedPassRefusesAPlannedStepWithoutItsCountOnTheCard) {
  const AccessorConfig cfg = config();
  device::CardSet set = device::CardSet::from_list("0");
  auto group = comm::make_group(set, std::chrono::seconds(60));
  std::vector<uint64_t> plan(1, 2);
  for (const bool padded : {true, false}) {
    HeterCommOptions options;
    options.missing_keys = MissingKeyPolicy::kFail;
    options.padded_steps = padded;
    std::string message;
    set.run_on_cards([&](device::Card& card) {
      card_table::CardSparseStore store(card, cfg);
      HeterComm hc(card, store, group->at(0), options);
      StepBounds bounds;
      bounds.occurrences = 4;
      bounds.unique = 2;
      bounds.received = 2;
      bounds.pair_block = 2;
      hc.reserve_steps(bounds);
      try {
        hc.plan_next_step({plan.data(), 1u});
      } catch (const Error& e) {
        message = e.what();
      }
    });
    if (padded) {
      EXPECT_NE(message.find("HeterComm on card 0: a planned step of a padded pass needs its "
                             "occurrence count (n_on_card)"),
                std::string::npos)
          << message;
    } else {
      EXPECT_TRUE(message.empty()) << message;
    }
  }
}

// A plan whose width is not the placement's is refused before the step (the trainer reads the
// Collective flag in two places to make the plan and the placement).
TEST(PlannedCountsWidth, APlanForTheOtherPlacementIsRefusedNamingBothWidths) {
  GPUBOX_REQUIRE_CARDS(2);
  const AccessorConfig cfg = config();
  device::CardSet set = device::CardSet::from_list("0,1");
  auto group = comm::make_group(set, std::chrono::seconds(60));
  std::vector<uint64_t> plan(4, 1);
  std::vector<std::string> messages(2);
  for (const Placement placement : {Placement::kSharded, Placement::kReplicated}) {
    HeterCommOptions options;
    options.missing_keys = MissingKeyPolicy::kFail;
    options.placement = placement;
    const bool replicated = placement == Placement::kReplicated;
    set.run_on_cards([&](device::Card& card) {
      const int c = card.local_index();
      card_table::CardSparseStore store(card, cfg);
      HeterComm hc(card, store, group->at(c), options);
      hc.plan_next_step({plan.data(), replicated ? 1u : 2u});  // the placement's own: taken
      try {
        hc.plan_next_step({plan.data(), replicated ? 2u : 1u});
      } catch (const Error& e) {
        messages[c] = e.what();
      }
    });
    for (int c = 0; c < 2; ++c) {
      const std::string& m = messages[c];
      ASSERT_FALSE(m.empty()) << "card " << c << " took a plan for the other placement";
      EXPECT_NE(m.find("HeterComm on card " + std::to_string(c) + ": a step plan of " +
                       (replicated ? "2" : "1") + " counts per card"),
                std::string::npos)
          << m;
      EXPECT_NE(m.find(replicated ? "replicated placement (Collective mode) takes 1"
                                  : "sharded placement takes one per owner card (2)"),
                std::string::npos)
          << m;
      messages[c].clear();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cards, PaddedSteps,
                         ::testing::Combine(::testing::Values(1, 2, 4),
                                            ::testing::Values(Placement::kSharded,
                                                              Placement::kReplicated)),
                         [](const auto& info) {
                           return std::to_string(std::get<0>(info.param)) + "cards_" +
                                  (std::get<1>(info.param) == Placement::kSharded ? "sharded"
                                                                                  : "replicated");
                         });

}  // namespace
}  // namespace gpubox::heter_comm
