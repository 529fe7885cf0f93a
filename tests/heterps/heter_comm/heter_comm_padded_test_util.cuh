// Shared helpers of the padded-step tests (heter_comm_padded_test.cu,
// heter_comm_padded_checks_test.cu, one binary): seeded skewed batches of a key universe with
// their step plans and the pass's bounds, one run of those steps through HeterComm on 1-4
// simulated cards (planned unpadded, padded eagerly or as step graphs), and the PaddedSteps
// fixture over (cards, placement).
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "heterps/device/counters.hpp"
#include "heterps/heter_comm/heter_comm.hpp"
#include "table/sparse_row/accessor.hpp"

namespace gpubox::heter_comm::padded_test {

constexpr int kSteps = 9;
constexpr int kUniverse = 600;

inline table::AccessorConfig config() {
  table::AccessorConfig cfg;
  cfg.optimizer.kind = table::SparseOptimizerKind::kAdagrad;
  cfg.mf_dim = 8;
  cfg.optimizer.learning_rate = 0.1f;
  cfg.optimizer.mf_learning_rate = 0.08f;
  cfg.embedx_threshold = 1.5f;  // embedx appears mid-run for the hot keys
  cfg.seed = 5;
  return cfg;
}

// kUniverse keys, one of them 0.
std::vector<uint64_t> universe();

// batches[step][card]: skewed keys (rank ~ u^3), a size that varies per step and card.
struct Data {
  std::vector<std::vector<std::vector<uint64_t>>> keys;
  std::vector<std::vector<std::vector<float>>> grads;
  // Sharded: [step][src * cards + dst], the distinct keys src sends owner dst; replicated:
  // [step][src], src's distinct keys (which every card receives).
  std::vector<std::vector<uint64_t>> plan;
  StepBounds bounds;  // the pass's maxima over every card (enough)
};

Data make_data(int cards, int push_dim, Placement placement);

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
  std::vector<int64_t> table_steps;       // per card: HeterComm::table_steps after the steps
};

// One run of data's steps on `cards` cards, planned as `mode` says, each step used as `use` says.
// `wrong_plan` replaces step `wrong_step`'s plan; `absent` (when not 0) is never placed on its
// owner.
// `cfg`: the rows' rule (config() unless given). `collective_timeout`: the group's bound on each
// wait (a failing run passes a short one, so that the engine's own message, naming the wait and
// the collective, comes before a test's HangWatchdog).
RunResult run(int cards, Placement placement, Mode mode, const Data& data,
              const std::vector<uint64_t>* wrong_plan = nullptr, int wrong_step = -1,
              uint64_t absent = 0, Use use = Use::kTrain,
              const table::AccessorConfig& cfg = config(),
              std::chrono::milliseconds collective_timeout = std::chrono::seconds(60));

bool same_bits(const std::vector<float>& a, const std::vector<float>& b);

class PaddedSteps : public ::testing::TestWithParam<std::tuple<int, Placement>> {
 protected:
  int cards() const { return std::get<0>(GetParam()); }
  Placement placement() const { return std::get<1>(GetParam()); }
  bool replicated() const { return placement() == Placement::kReplicated; }
  Data data() const {
    const table::RowLayout layout =
        table::RowLayout::make(config().optimizer.kind, config().mf_dim);
    return make_data(cards(), layout.push_dim(), placement());
  }
};

}  // namespace gpubox::heter_comm::padded_test
