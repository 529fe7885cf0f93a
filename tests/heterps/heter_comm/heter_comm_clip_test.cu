// push_pulled's clipping by global norm (NormClipState, heter_comm_types.hpp) on 1-3 simulated
// cards, sharded and replicated, against a float64 host reference over several steps: the factor
// every card writes is clip / max(clip, sqrt(dense squares + sum over the step's distinct keys of
// (sparse_scale x the key's push gradients summed over all cards)^2)), where a key's embedx
// gradients join only when its row held its embedx part before the step (the rows before each
// step read from the stores; embedx_threshold makes parts appear mid-run).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <ostream>
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
      hc.pull(keys.data(), b.keys.size(), out.data(), card.stream());
      hc.push_pulled(grads.data(), card.stream(), nullptr, state.data());
      factors[c] = device::to_host(state)[0].factor;
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

INSTANTIATE_TEST_SUITE_P(Cards, HeterCommClip,
                         ::testing::Values(ClipCase{1, false}, ClipCase{2, false},
                                           ClipCase{3, false}, ClipCase{3, true}),
                         [](const ::testing::TestParamInfo<ClipCase>& info) {
                           return std::to_string(info.param.cards) + "cards" +
                                  (info.param.replicated ? "Replicated" : "Sharded");
                         });

}  // namespace
}  // namespace gpubox::heter_comm
