// push_pulled's clipping by global norm (NormClipState, heter_comm_types.hpp) on 1-3 simulated
// cards, sharded and replicated, against a float64 host reference over several steps: the factor
// every card writes is clip / max(clip, sqrt(dense squares + sum over the step's distinct keys of
// (sparse_scale x the key's push gradients summed over all cards)^2)), where a key's embedx
// gradients join only when its row held its embedx part before the step (the rows before each
// step read from the stores; embedx_threshold makes parts appear mid-run). The same through the
// planned steps (plan_next_step) at the pass's fixed sizes, replayed as step graphs over batches
// of varying size (an empty and a short one), with rows that hold their embedx part from the
// start. A NaN or inf sparse gradient makes the norm non-finite: every card's veto word then
// says kNonFiniteNorm and no row changes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include "common/hash.hpp"
#include "heterps/device/card.hpp"
#include "heterps/device/memory.hpp"
#include "heterps/heter_comm/heter_comm.hpp"
#include "table/sparse_row/optimizer.hpp"
#include "tests/heterps/device/test_cards.hpp"
#include "tests/heterps/heter_comm/heter_comm_test_util.cuh"

namespace gpubox::heter_comm {
namespace {

using cluster_test::Batch;
using cluster_test::BatchMaker;
using cluster_test::Cluster;
using cluster_test::same_bytes;
using cluster_test::store_rows;
using cluster_test::test_config;
using table::RowLayout;
using table::SparseOptimizerKind;
using table::optimizer::PushRecord;

struct ClipCase {
  int cards;
  bool replicated;
};

inline void PrintTo(const ClipCase& c, std::ostream* os) {
  *os << c.cards << " cards, " << (c.replicated ? "replicated" : "sharded");
}

class HeterCommClip : public ::testing::TestWithParam<ClipCase> {};

// The reference factor of one step from every card's batch and the rows before it (by key, all
// cards' stores together: sharded, each key on its owner; replicated, every card's are equal).
double reference_factor(const std::vector<Batch>& batches, int push_dim,
                        const std::map<uint64_t, std::vector<float>>& rows_before,
                        const RowLayout& layout, double dense_squares, double scale, double clip,
                        bool with_sparse = true) {
  std::map<uint64_t, std::vector<double>> merged;
  for (const Batch& b : batches) {
    for (std::size_t i = 0; i < b.keys.size(); ++i) {
      std::vector<double>& sum = merged[b.keys[i]];
      sum.resize(push_dim, 0.0);
      for (int f = 0; f < push_dim; ++f) sum[f] += b.grads[i * push_dim + f];
    }
  }
  double squares = dense_squares;
  for (const auto& [key, sum] : merged) {
    const auto row = rows_before.find(key);
    const bool embedx = row != rows_before.end() && row->second[layout.mf_size()] > 0.0f;
    const int end = embedx ? PushRecord::kEmbedxG + layout.mf_dim : PushRecord::kEmbedxG;
    for (int f = PushRecord::kEmbedG; f < end; ++f) {
      if (with_sparse) squares += (scale * sum[f]) * (scale * sum[f]);
    }
  }
  return clip / std::max(clip, std::sqrt(squares));
}

TEST_P(HeterCommClip, EveryCardWritesTheFloat64FactorOfDenseAndMergedSparseSquares) {
  const ClipCase param = GetParam();
  GPUBOX_REQUIRE_CARDS(param.cards);
  const table::AccessorConfig cfg = test_config(SparseOptimizerKind::kSgd);
  const RowLayout layout = RowLayout::make(cfg.optimizer.kind, cfg.mf_dim);
  HeterCommOptions options;
  if (param.replicated) options.placement = Placement::kReplicated;
  Cluster cluster(param.cards, cfg, options);
  BatchMaker maker(/*seed=*/31, layout.push_dim());
  const double scale = 1.0 / 64;
  const double dense_squares = 0.01;
  bool embedx_counted = false;
  for (int step = 0; step < 6; ++step) {
    std::vector<Batch> batches;
    for (int c = 0; c < param.cards; ++c) batches.push_back(maker.make(c == 1 ? 0 : 150));
    std::map<uint64_t, std::vector<float>> before;
    for (int c = 0; c < param.cards; ++c) {
      for (auto& [key, row] : store_rows(cluster, c, layout)) before[key] = row;
    }
    for (const auto& [key, row] : before) embedx_counted |= row[layout.mf_size()] > 0.0f;
    // A clip the step's norm is above (a third of the norm at step 0's scale), then under it.
    const double clip = step % 2 == 0 ? 0.05 : 1e6;
    const double want =
        reference_factor(batches, layout.push_dim(), before, layout, dense_squares, scale, clip);
    if (step == 0) {
      ASSERT_LT(want, 1.0) << "the step's norm must be above the clip";
      ASSERT_GT(reference_factor(batches, layout.push_dim(), before, layout, dense_squares, scale,
                                 clip, /*with_sparse=*/false) -
                    want,
                1e-2);
    }
    std::vector<float> factors(param.cards, -1.0f);
    cluster.run([&](device::Card& card) {
      const int c = card.local_index();
      HeterComm& hc = cluster.heter_comm(c);
      const Batch& b = batches[c];
      auto keys = device::to_device(b.keys, card.memory(), card.stream());
      auto grads = device::to_device(b.grads, card.memory(), card.stream());
      auto out = card.make_buffer<float>(b.keys.size() * hc.pull_dim());
      NormClipState host_state;
      host_state.squares = dense_squares;
      host_state.sparse_scale = static_cast<float>(scale);
      host_state.clip_norm = static_cast<float>(clip);
      host_state.factor = -1.0f;
      auto state =
          device::to_device(std::vector<NormClipState>{host_state}, card.memory(), card.stream());
      auto veto = device::to_device(std::vector<uint32_t>{kNoVeto}, card.memory(), card.stream());
      hc.pull(keys.data(), b.keys.size(), out.data(), card.stream());
      hc.push_pulled(grads.data(), card.stream(), veto.data(), state.data());
      factors[c] = device::to_host(state)[0].factor;
      EXPECT_EQ(device::to_host(veto)[0], kNoVeto) << "a finite norm vetoed step " << step;
    });
    for (int c = 0; c < param.cards; ++c) {
      EXPECT_NEAR(factors[c], want, 1e-5 * want) << "step " << step << ", card " << c;
      EXPECT_EQ(factors[c], factors[0]) << "step " << step << ", card " << c;
    }
    if (clip > 1e5) {
      for (int c = 0; c < param.cards; ++c) EXPECT_EQ(factors[c], 1.0f) << "step " << step;
    }
  }
  EXPECT_TRUE(embedx_counted) << "no row held an embedx part before a step: that rule is untested";
}

// One card's clip inputs for a step, its veto word reset, both written on `card`'s stream.
void set_clip(device::Card& card, NormClipState* state, uint32_t* veto, double dense_squares,
              double scale, double clip) {
  NormClipState in;
  in.squares = dense_squares;
  in.sparse_scale = static_cast<float>(scale);
  in.clip_norm = static_cast<float>(clip);
  in.factor = -1.0f;
  const uint32_t no_veto = kNoVeto;
  device::copy_async(state, &in, 1, card.stream());
  device::copy_async(veto, &no_veto, 1, card.stream());
  card.stream().synchronize();  // `in` and `no_veto` are on this frame
}

// A NaN, then an inf, in one sparse gradient of one card: the global norm is not finite, so
// every card's veto word says kNonFiniteNorm (a word that already held the dense check's veto
// keeps it) and no row changes, on any card. Mutation caught: ClipFactor not writing the veto
// (rows take NaN, the words stay kNoVeto).
TEST_P(HeterCommClip, ANonFiniteSparseGradientVetoesTheStepOnEveryCard) {
  const ClipCase param = GetParam();
  GPUBOX_REQUIRE_CARDS(param.cards);
  const table::AccessorConfig cfg = test_config(SparseOptimizerKind::kSgd);
  const RowLayout layout = RowLayout::make(cfg.optimizer.kind, cfg.mf_dim);
  HeterCommOptions options;
  if (param.replicated) options.placement = Placement::kReplicated;
  Cluster cluster(param.cards, cfg, options);
  BatchMaker maker(/*seed=*/37, layout.push_dim());
  std::vector<Batch> batches;
  for (int c = 0; c < param.cards; ++c) batches.push_back(maker.make(120));
  const float kNan = std::numeric_limits<float>::quiet_NaN();
  const float kInf = std::numeric_limits<float>::infinity();
  // Step 0 creates the rows (finite); steps 1-3 push the same keys: a NaN, an inf, then a NaN
  // under a dense verdict that already vetoed the step (index 5).
  struct Poison {
    float value;
    uint32_t veto_before;
  };
  const std::vector<Poison> steps = {{0.0f, kNoVeto}, {kNan, kNoVeto}, {kInf, kNoVeto}, {kNan, 5u}};
  for (std::size_t step = 0; step < steps.size(); ++step) {
    std::vector<std::map<uint64_t, std::vector<float>>> before(param.cards);
    for (int c = 0; c < param.cards; ++c) before[c] = store_rows(cluster, c, layout);
    std::vector<uint32_t> vetoes(param.cards, 0);
    cluster.run([&](device::Card& card) {
      const int c = card.local_index();
      HeterComm& hc = cluster.heter_comm(c);
      Batch b = batches[c];
      if (c == 0 && step > 0)
        b.grads[3 * layout.push_dim() + PushRecord::kEmbedG] = steps[step].value;
      auto keys = device::to_device(b.keys, card.memory(), card.stream());
      auto grads = device::to_device(b.grads, card.memory(), card.stream());
      auto out = card.make_buffer<float>(b.keys.size() * hc.pull_dim());
      auto state = card.make_buffer<NormClipState>(1);
      auto veto = card.make_buffer<uint32_t>(1);
      set_clip(card, state.data(), veto.data(), 0.01, 1.0 / 64, 0.05);
      const uint32_t veto_before = steps[step].veto_before;
      device::copy_async(veto.data(), &veto_before, 1, card.stream());
      hc.pull(keys.data(), b.keys.size(), out.data(), card.stream());
      hc.push_pulled(grads.data(), card.stream(), veto.data(), state.data());
      vetoes[c] = device::to_host(veto)[0];
    });
    const uint32_t want = step == 0                            ? kNoVeto
                          : steps[step].veto_before != kNoVeto ? steps[step].veto_before
                                                               : kNonFiniteNorm;
    for (int c = 0; c < param.cards; ++c) {
      EXPECT_EQ(vetoes[c], want) << "step " << step << ", card " << c;
      if (step == 0) continue;
      const auto after = store_rows(cluster, c, layout);
      ASSERT_EQ(after.size(), before[c].size()) << "step " << step << ", card " << c;
      for (const auto& [key, row] : after) {
        EXPECT_TRUE(same_bytes(row, before[c].at(key)))
            << "step " << step << ", card " << c << ": key " << key << " changed";
      }
    }
  }
}

// The planned steps (plan_next_step with the card's occurrence count, MissingKeyPolicy::kFail: the
// trainer's) at the pass's fixed sizes, as step graphs captured once and replayed over batches of
// every size (one card's empty, a short last step), with the same NormClipState and veto buffers
// throughout: the factor of every step as the float64 reference's, where half the rows hold their
// embedx part from the start (its squares count from step 0) and no part appears during the run
// (embedx_threshold out of reach), so the rows before every step are the placed ones. The last
// step's NaN gradient vetoes it on every card.
TEST_P(HeterCommClip, PlannedPaddedStepsWriteTheFloat64FactorAndVetoANaN) {
  const ClipCase param = GetParam();
  GPUBOX_REQUIRE_CARDS(param.cards);
  table::AccessorConfig cfg = test_config(SparseOptimizerKind::kSgd);
  cfg.embedx_threshold = 1e9f;
  const RowLayout layout = RowLayout::make(cfg.optimizer.kind, cfg.mf_dim);
  const int cards = param.cards;
  const int push_dim = layout.push_dim();
  BatchMaker maker(/*seed=*/41, push_dim);
  constexpr int kSteps = 6;
  std::vector<std::vector<Batch>> batches(kSteps);
  std::set<uint64_t> known;
  for (int s = 0; s < kSteps; ++s) {
    for (int c = 0; c < cards; ++c) {
      const std::size_t n = s == kSteps - 2 ? 17 : (s == 2 && c == 0) ? 0 : 60 + 45 * ((s + c) % 3);
      batches[s].push_back(maker.make(n));
      known.insert(batches[s][c].keys.begin(), batches[s][c].keys.end());
    }
  }
  batches[kSteps - 1][0].grads[2 * push_dim + PushRecord::kEmbedG] =
      std::numeric_limits<float>::quiet_NaN();
  // The placed rows (every key on its owner, or on every card): half with their embedx part.
  std::map<uint64_t, std::vector<float>> placed;
  for (uint64_t k : known) {
    std::vector<float> row(layout.stride());
    table::init_row(row.data(), layout, cfg, k, 1);
    if (mix64(k) & 1) table::create_embedx(row.data(), layout, cfg, k);
    placed[k] = row;
  }
  // The plans and the pass's bounds, as the trainer computes them.
  const std::size_t plan_row = param.replicated ? 1 : static_cast<std::size_t>(cards);
  std::vector<std::vector<uint64_t>> plans(kSteps, std::vector<uint64_t>(cards * plan_row, 0));
  StepBounds bounds;
  for (int s = 0; s < kSteps; ++s) {
    std::vector<std::size_t> received(cards, 0);
    for (int c = 0; c < cards; ++c) {
      const std::set<uint64_t> distinct(batches[s][c].keys.begin(), batches[s][c].keys.end());
      for (uint64_t k : distinct) {
        const int dst = param.replicated ? 0 : owner_card(k, cards);
        ++plans[s][c * plan_row + dst];
        for (int o = 0; o < cards; ++o) {
          if (param.replicated || o == dst) ++received[o];
        }
      }
      bounds.occurrences = std::max(bounds.occurrences, batches[s][c].keys.size());
      bounds.unique = std::max(bounds.unique, distinct.size());
      bounds.block = std::max(bounds.block, distinct.size());
      for (std::size_t d = 0; d < plan_row; ++d) {
        bounds.pair_block = std::max<std::size_t>(bounds.pair_block, plans[s][c * plan_row + d]);
      }
    }
    for (int o = 0; o < cards; ++o) bounds.received = std::max(bounds.received, received[o]);
  }
  HeterCommOptions options;
  options.missing_keys = MissingKeyPolicy::kFail;
  if (param.replicated) options.placement = Placement::kReplicated;
  Cluster cluster(cards, cfg, options);
  const double dense_squares = 0.004;
  const double scale = 1.0 / 128;
  const auto clip_of = [](int s) { return s % 2 == 0 ? 0.02 : 1e6; };
  std::vector<std::vector<float>> factors(kSteps, std::vector<float>(cards, -1.0f));
  std::vector<std::vector<uint32_t>> vetoes(kSteps, std::vector<uint32_t>(cards, 0));
  std::vector<bool> padded(cards, false);
  cluster.run([&](device::Card& card) {
    const int c = card.local_index();
    const device::Stream& stream = card.stream();
    HeterComm& hc = cluster.heter_comm(c);
    std::vector<uint64_t> mine;
    std::vector<float> rows;
    for (const auto& [k, row] : placed) {
      if (!param.replicated && owner_card(k, cards) != c) continue;
      mine.push_back(k);
      rows.insert(rows.end(), row.begin(), row.end());
    }
    auto dk = device::to_device(mine, card.memory(), stream);
    auto dr = device::to_device(rows, card.memory(), stream);
    cluster.store(c).insert_rows(dk.data(), dr.data(), mine.size(), stream);
    hc.reserve_steps(bounds);
    padded[c] = hc.pads_planned_steps();
    const std::size_t most = std::max<std::size_t>(bounds.occurrences, 1);
    auto keys = card.make_buffer<uint64_t>(most);
    auto grads = card.make_buffer<float>(most * push_dim);
    auto pulled = card.make_buffer<float>(most * hc.pull_dim());
    auto n_on_card = card.make_buffer<uint64_t>(1);
    auto state = card.make_buffer<NormClipState>(1);
    auto veto = card.make_buffer<uint32_t>(1);
    stream.synchronize();
    for (int s = 0; s < kSteps; ++s) {
      const Batch& b = batches[s][c];
      const uint64_t n = b.keys.size();
      if (n > 0) {
        device::copy_async(keys.data(), b.keys.data(), n, stream);
        device::copy_async(grads.data(), b.grads.data(), b.grads.size(), stream);
      }
      device::copy_async(n_on_card.data(), &n, 1, stream);
      set_clip(card, state.data(), veto.data(), dense_squares, scale, clip_of(s));
      cluster.comm(c).set_step(0, s);
      hc.plan_next_step({plans[s].data(), plan_row}, n_on_card.data());
      hc.pull(keys.data(), n, pulled.data(), stream);
      hc.push_pulled(grads.data(), stream, veto.data(), state.data());
      factors[s][c] = device::to_host(state)[0].factor;
      vetoes[s][c] = device::to_host(veto)[0];
    }
    cluster.comm(c).set_step(-1, -1);
    hc.drain_checks();
  });
  for (int c = 0; c < cards; ++c) ASSERT_TRUE(padded[c]) << "card " << c << " ran unpadded steps";
  bool embedx_counted = false;
  for (const auto& [key, row] : placed) embedx_counted |= row[layout.mf_size()] > 0.0f;
  ASSERT_TRUE(embedx_counted);
  for (int s = 0; s < kSteps - 1; ++s) {
    const double want =
        reference_factor(batches[s], push_dim, placed, layout, dense_squares, scale, clip_of(s));
    if (s == 0) {
      ASSERT_LT(want, 1.0) << "the step's norm must be above the clip";
    }
    for (int c = 0; c < cards; ++c) {
      EXPECT_NEAR(factors[s][c], want, 1e-5 * want) << "step " << s << ", card " << c;
      EXPECT_EQ(factors[s][c], factors[s][0]) << "step " << s << ", card " << c;
      EXPECT_EQ(vetoes[s][c], kNoVeto) << "step " << s << ", card " << c;
    }
  }
  for (int c = 0; c < cards; ++c) {
    EXPECT_EQ(vetoes[kSteps - 1][c], kNonFiniteNorm) << "the NaN step, card " << c;
  }
}

INSTANTIATE_TEST_SUITE_P(Cards, HeterCommClip,
                         ::testing::Values(ClipCase{1, false}, ClipCase{2, false},
                                           ClipCase{3, false}, ClipCase{3, true}),
                         [](const ::testing::TestParamInfo<ClipCase>& info) {
                           return std::to_string(info.param.cards) + "cards" +
                                  (info.param.replicated ? "Replicated" : "Sharded");
                         });

}  // namespace
}  // namespace gpubox::heter_comm
