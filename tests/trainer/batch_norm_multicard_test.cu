// dlrm with batch norm on two cards, as the trainer steps it (forward_backward on each card's
// share, one all_reduce_sum of the flat gradient buffer, the same optimizer step): each card
// normalises its own batch (Paddle's BatchNorm1D, not SyncBatchNorm), and the running statistics
// stay one model: bit-identical on both cards, moved by the cards' changes summed, i.e. toward
// their batch-weighted mean statistics.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "heterps/comm/communicator.hpp"
#include "heterps/device/card.hpp"
#include "tests/heterps/device/test_cards.hpp"
#include "tests/trainer/field_model_check.hpp"
#include "trainer/nn/dense_model.hpp"
#include "trainer/nn/dense_optimizer.hpp"

namespace gpubox::trainer {
namespace {

using testing::HostBatch;

// forward_backward of `h` with the dense scale 1 / `global`; returns the gradient buffer.
std::vector<float> gradients(device::Card& card, DenseModel& model, const HostBatch& h,
                             int64_t global) {
  const testing::CardBatch on_card(card, h, model.config().slots);
  auto push = card.make_buffer<float>(h.offsets.back() * model.pool().push_dim());
  model.forward_backward(on_card.view, GradScales{1.0f / static_cast<float>(global), 1.0f},
                         push.data());
  return model.parameters().grads_to_host();
}

const ParamBlock& block_named(const DenseParameters& params, const std::string& name) {
  for (const ParamBlock& b : params.blocks()) {
    if (b.name == name) return b;
  }
  GPUBOX_FAIL("no parameter block ", name);
}

// The float64 mean and biased variance of each column of relu(x W + b) over the batch's rows:
// the bottom MLP's first layer, whose norm (bot_0.bn) sees the dense features only.
void first_bottom_statistics(const HostBatch& h, const DenseModelConfig& cfg,
                             const std::vector<float>& values, const DenseParameters& params,
                             std::vector<double>* mean, std::vector<double>* var) {
  const ParamBlock& w = block_named(params, "bot_0.w");
  const ParamBlock& b = block_named(params, "bot_0.b");
  const int out = cfg.bot_layer_sizes[0];
  std::vector<double> sum(out, 0.0), squares(out, 0.0);
  for (int64_t i = 0; i < h.batch; ++i) {
    for (int j = 0; j < out; ++j) {
      double z = values[b.offset + j];
      for (int k = 0; k < cfg.dense_dim; ++k) {
        z += static_cast<double>(h.dense[i * cfg.dense_dim + k]) *
             values[w.offset + static_cast<std::size_t>(k * out + j)];
      }
      z = std::max(z, 0.0);
      sum[j] += z;
      squares[j] += z * z;
    }
  }
  mean->assign(out, 0.0);
  var->assign(out, 0.0);
  for (int j = 0; j < out; ++j) {
    (*mean)[j] = sum[j] / static_cast<double>(h.batch);
    (*var)[j] = squares[j] / static_cast<double>(h.batch) - (*mean)[j] * (*mean)[j];
  }
}

TEST(BatchNormMultiCard, TwoCardsKeepOneSetOfRunningStatistics) {
  GPUBOX_REQUIRE_CARDS(2);
  DenseModelConfig cfg;
  cfg.kind = ModelKind::kDlrm;
  cfg.slots = 4;
  cfg.mf_dim = 3;
  cfg.dense_dim = 3;
  cfg.bot_layer_sizes = {8, 4};
  cfg.fc_sizes = {16, 8};
  cfg.seed = 5;
  cfg.batch_norm = true;
  DenseOptimizerConfig opt_cfg;
  opt_cfg.kind = DenseOptimizerKind::kAdam;
  opt_cfg.learning_rate = 0.01f;
  // Each card's own batch per step (8 and 12 instances: the shares differ).
  const int64_t sizes[2] = {8, 12}, global = 20, steps = 4;
  std::mt19937_64 rng(17);
  std::vector<HostBatch> batches[2];
  for (int64_t s = 0; s < steps; ++s) {
    for (int r = 0; r < 2; ++r) batches[r].push_back(testing::make_field_batch(sizes[r], cfg, rng));
  }

  // What the first step's statistics change must be: each card's share computed alone.
  device::CardSet one = device::CardSet::from_list("0");
  one.card(0).activate();
  DenseModel alone(one.card(0), cfg);
  const std::vector<float> initial = alone.parameters().values_to_host();
  const std::vector<float> g0 = gradients(one.card(0), alone, batches[0][0], global);
  const std::vector<float> g1 = gradients(one.card(0), alone, batches[1][0], global);

  device::CardSet two = device::CardSet::from_list("0,1");
  std::unique_ptr<comm::CommGroup> group = comm::make_group(two);
  std::vector<std::vector<float>> first(2), last(2);
  two.run_on_cards(
      [&](device::Card& card) {
        DenseModel model(card, cfg);
        DenseOptimizer opt(card, opt_cfg, model.parameters().size());
        DenseParameters& params = model.parameters();
        const int r = card.local_index();
        for (int64_t s = 0; s < steps; ++s) {
          gradients(card, model, batches[r][s], global);
          group->at(r).all_reduce_sum(params.grads().data(), params.grads().data(), params.size(),
                                      card.stream());
          opt.step(params);
          card.stream().synchronize();  // the next step's batch is allocated (device rule 1)
          if (s == 0) first[r] = params.values_to_host();
        }
        last[r] = params.values_to_host();
      },
      [&](const std::string& reason) { group->abort(reason); });

  EXPECT_EQ(last[0], last[1]) << "the cards' dense parameters (statistics included) differ";
  std::size_t statistics = 0;
  for (const ParamBlock& b : alone.parameters().blocks()) {
    if (!b.statistic) continue;
    for (std::size_t k = b.offset; k < b.offset + b.count; ++k, ++statistics) {
      EXPECT_NEAR(first[0][k], initial[k] + g0[k] + g1[k], 1e-6) << b.name;
      // The variance starts at 1 and moves toward the batches' (a dead column's mean stays 0).
      if (b.name.find("running_var") != std::string::npos) {
        EXPECT_NE(last[0][k], initial[k]) << b.name << ": never moved";
      }
    }
  }
  // Four norms (two bottom, two top hidden) of 8 + 4 + 16 + 8 columns, mean and variance.
  EXPECT_EQ(statistics, 2u * (8 + 4 + 16 + 8));

  // Against a float64 reference, not the code's own changes: the first step moves bot_0.bn's
  // running statistics by 0.1 x (the cards' batch-weighted mean statistic - running), i.e. each
  // card's share is its 8 or 12 of the 20 rows (equal shares fail it: 8 columns when written).
  std::vector<double> mu[2], var[2];
  for (int r = 0; r < 2; ++r) {
    first_bottom_statistics(batches[r][0], cfg, initial, alone.parameters(), &mu[r], &var[r]);
  }
  const ParamBlock& mean_block = block_named(alone.parameters(), "bot_0.bn.running_mean");
  const ParamBlock& var_block = block_named(alone.parameters(), "bot_0.bn.running_var");
  ASSERT_EQ(mean_block.count, mu[0].size());
  for (std::size_t j = 0; j < mean_block.count; ++j) {
    const double mean_want =
        0.9 * initial[mean_block.offset + j] + 0.1 * (8.0 * mu[0][j] + 12.0 * mu[1][j]) / 20.0;
    const double var_want =
        0.9 * initial[var_block.offset + j] + 0.1 * (8.0 * var[0][j] + 12.0 * var[1][j]) / 20.0;
    EXPECT_NEAR(first[0][mean_block.offset + j], mean_want, 1e-5) << "column " << j;
    EXPECT_NEAR(first[0][var_block.offset + j], var_want, 1e-5) << "column " << j;
  }
}

}  // namespace
}  // namespace gpubox::trainer
